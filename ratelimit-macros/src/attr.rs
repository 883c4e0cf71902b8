//! Parsing one `#[rate_limit(...)]` attribute's arguments into typed values, each keeping the
//! span of the token it came from so that later checks can point at it.
//!
//! Syntax errors (`num 5`, a trailing `=`) stop the parse; every other mistake (an unknown
//! name, a bad value, a duplicate) is collected so that all of them are reported at once.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned as _;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Token};

/// The argument names, in the order the docs list them.
pub(crate) const KNOWN: &[&str] = &[
    "algo",
    "num",
    "time",
    "by",
    "key",
    "burst",
    "cost",
    "scope",
    "framework",
    "quota",
    "count",
    "shadow",
    "export",
    "on_store_error",
    "replica_ack",
    "wait",
    "settle",
    "lease",
    "lease_max",
];

/// Names people write for an argument by habit (other libraries' words), and the right one.
const ALIASES: &[(&str, &str)] = &[
    ("algorithm", "algo"),
    ("algos", "algo"),
    ("strategy", "algo"),
    ("kind", "algo"),
    ("limit", "num"),
    ("max", "num"),
    ("rate", "num"),
    ("requests", "num"),
    ("calls", "num"),
    ("number", "num"),
    ("period", "time"),
    ("window", "time"),
    ("duration", "time"),
    ("interval", "time"),
    ("per", "time"),
    ("seconds", "time"),
    ("secs", "time"),
    ("key_by", "by"),
    ("source", "by"),
    ("identifier", "by"),
    ("capacity", "burst"),
    ("bucket", "burst"),
    ("weight", "cost"),
    ("units", "cost"),
    ("tokens", "cost"),
    ("name", "scope"),
    ("namespace", "scope"),
    ("plan", "quota"),
    ("deduct_when", "count"),
    ("counts", "count"),
    ("dry_run", "shadow"),
    ("dryrun", "shadow"),
    ("export_as", "export"),
    ("exports", "export"),
    ("failure_policy", "on_store_error"),
    ("on_failure", "on_store_error"),
    ("on_error", "on_store_error"),
    ("failure_mode", "on_store_error"),
    ("fail_mode", "on_store_error"),
    ("fail_open", "on_store_error"),
    ("fail_closed", "on_store_error"),
    ("on_store_failure", "on_store_error"),
    ("max_wait", "wait"),
    ("wait_for", "wait"),
    ("wait_up_to", "wait"),
    ("block_for", "wait"),
    ("actual", "settle"),
    ("actual_cost", "settle"),
    ("settle_with", "settle"),
    ("prefetch", "lease"),
    ("batch", "lease"),
    ("lease_ttl", "lease"),
    ("lease_for", "lease"),
    ("lease_units", "lease_max"),
    ("max_lease", "lease_max"),
];

/// The algorithms `algo` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    Fixed,
    Sliding,
    Leaky,
    Token,
    Gcra,
    SlidingCounter,
    Concurrency,
}

impl Algo {
    /// The variant of `ratelimit_runtime::Algorithm`.
    pub(crate) fn variant(self) -> &'static str {
        match self {
            Self::Fixed => "Fixed",
            Self::Sliding => "Sliding",
            Self::Leaky => "Leaky",
            Self::Token => "Token",
            Self::Gcra => "Gcra",
            Self::SlidingCounter => "SlidingCounter",
            Self::Concurrency => "Concurrency",
        }
    }

    /// How its numbers are bounded (the shared rules' kind).
    pub(crate) fn kind(self) -> crate::rules::Kind {
        use crate::rules::Kind;
        match self {
            Self::Fixed => Kind::Window,
            Self::Sliding => Kind::Log,
            Self::Leaky | Self::Token => Kind::Bucket,
            Self::Gcra => Kind::Gcra,
            Self::SlidingCounter => Kind::Counter,
            Self::Concurrency => Kind::Slots,
        }
    }
}

/// What `on_store_error` names: the runtime's `FailurePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnStoreError {
    Allow,
    Deny,
    Local,
}

impl OnStoreError {
    /// The variant of `ratelimit_runtime::FailurePolicy`.
    pub(crate) fn variant(self) -> &'static str {
        match self {
            Self::Allow => "Allow",
            Self::Deny => "Deny",
            Self::Local => "Local",
        }
    }
}

/// What `by` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum By {
    Global,
    Ip,
    Url,
    User,
    AppId,
    /// A lower-cased header name.
    Header(String),
}

impl By {
    /// Whether this source needs an HTTP request.
    pub(crate) fn is_http(&self) -> bool {
        !matches!(self, Self::Global)
    }
}

/// The HTTP frameworks `framework` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framework {
    Axum,
    Actix,
}

/// One piece of a `key` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Literal text (braces already unescaped).
    Text(String),
    /// `{arg}` or `{arg.field.0}`: the argument's name, then the fields.
    Arg(Vec<String>),
}

/// A `key` argument: the literal and its parsed pieces.
#[derive(Debug, Clone)]
pub(crate) struct KeyTemplate {
    pub(crate) lit: LitStr,
    pub(crate) pieces: Vec<Piece>,
}

impl KeyTemplate {
    /// The names of the arguments the template reads, in order of first use.
    pub(crate) fn arg_roots(&self) -> Vec<&str> {
        let mut roots: Vec<&str> = Vec::new();
        for piece in &self.pieces {
            if let Piece::Arg(path) = piece {
                let root = path[0].as_str();
                if !roots.contains(&root) {
                    roots.push(root);
                }
            }
        }
        roots
    }
}

/// A value and the span of the token it was written with.
#[derive(Debug, Clone)]
pub(crate) struct Spanned<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

/// One attribute's arguments, each `None` when not written (or written wrong: the error is in
/// `errors`).
#[derive(Debug, Clone)]
pub(crate) struct Args {
    /// The span of the whole argument list, for "missing `num`".
    pub(crate) span: Span,
    pub(crate) algo: Option<Spanned<Algo>>,
    pub(crate) num: Option<Spanned<u64>>,
    /// The period in milliseconds.
    pub(crate) time: Option<Spanned<u64>>,
    pub(crate) by: Option<Spanned<By>>,
    pub(crate) key: Option<KeyTemplate>,
    pub(crate) burst: Option<Spanned<u64>>,
    pub(crate) cost: Option<Spanned<u64>>,
    pub(crate) scope: Option<Spanned<String>>,
    pub(crate) framework: Option<Spanned<Framework>>,
    /// The forms decided at run time or by a `const` item (`num = CONST`, `cost = items.len()`,
    /// `quota`, `count`).
    pub(crate) dynamic: DynamicArgs,
    /// `shadow = true`: rejections are logged and counted, never enforced.
    pub(crate) shadow: Option<Spanned<bool>>,
    /// `export = "LOGIN"`: the name of the const that holds the function's limits, spanned at
    /// the literal.
    pub(crate) export: Option<Ident>,
    /// `on_store_error = "deny"`: this limit's failure policy.
    pub(crate) on_store_error: Option<Spanned<OnStoreError>>,
    /// `replica_ack = true`: an admitted call waits for a replica to acknowledge its write.
    pub(crate) replica_ack: Option<Spanned<bool>>,
    /// `wait = "5s"`: the longest a limited call waits for a slot, in milliseconds.
    pub(crate) wait: Option<Spanned<u64>>,
    /// `lease = "100ms"`: the longest life of a lease of this limit's units, in milliseconds.
    pub(crate) lease: Option<Spanned<u64>>,
    /// `lease_max = 1000`: the most units one lease takes.
    pub(crate) lease_max: Option<Spanned<u64>>,
    /// Every mistake found while reading the values.
    pub(crate) errors: Vec<syn::Error>,
    /// The names written, right or wrong (an alias counts as the name it stands for), so that
    /// `num = 0` or `period = 60` is not also reported as a missing `num` / `time`.
    pub(crate) written: Vec<&'static str>,
    /// The list could not be parsed at all: `errors` says why, and no "missing `num`" is added.
    pub(crate) broken: bool,
}

/// `name = value`, as written.
struct RawArg {
    name: Ident,
    value: Expr,
}

impl Parse for RawArg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name: Ident = input.call(syn::ext::IdentExt::parse_any).map_err(|e| {
            syn::Error::new(
                e.span(),
                format!(
                    "expected `name = value` arguments; the names are {}",
                    known_list()
                ),
            )
        })?;
        let lookahead = input.lookahead1();
        if !lookahead.peek(Token![=]) {
            return Err(syn::Error::new(
                name.span(),
                format!("`{name}` needs a value: write `{name} = ...`"),
            ));
        }
        input.parse::<Token![=]>()?;
        let value: Expr = input.parse()?;
        Ok(Self { name, value })
    }
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let span = input.span();
        let raw = Punctuated::<RawArg, Token![,]>::parse_terminated(input)?;
        let mut args = Self::empty(span);
        let mut seen: Vec<Ident> = Vec::new();
        for arg in raw {
            args.set(&arg, &mut seen);
        }
        Ok(args)
    }
}

impl Args {
    /// Parses an argument list; a syntax error gives a `broken` list carrying that error.
    pub(crate) fn from_tokens(tokens: proc_macro2::TokenStream, span: Span) -> Self {
        match syn::parse::Parser::parse2(Self::parse, tokens) {
            Ok(mut args) => {
                args.span = span;
                args
            }
            Err(e) => {
                let mut args = Self::empty(span);
                args.errors.push(e);
                args.broken = true;
                args
            }
        }
    }

    /// No arguments (also the fallback when the list could not be parsed at all).
    pub(crate) fn empty(span: Span) -> Self {
        Self {
            span,
            algo: None,
            num: None,
            time: None,
            by: None,
            key: None,
            burst: None,
            cost: None,
            scope: None,
            framework: None,
            dynamic: DynamicArgs::default(),
            shadow: None,
            export: None,
            on_store_error: None,
            replica_ack: None,
            wait: None,
            lease: None,
            lease_max: None,
            errors: Vec::new(),
            written: Vec::new(),
            broken: false,
        }
    }

    fn set(&mut self, arg: &RawArg, seen: &mut Vec<Ident>) {
        let name = arg.name.to_string();
        let Some(known) = KNOWN.iter().find(|k| **k == name) else {
            let lower = name.to_ascii_lowercase();
            if let Some((_, right)) = ALIASES.iter().find(|(alias, _)| *alias == lower) {
                self.written.push(right);
            }
            self.errors.push(unknown_argument(&arg.name));
            return;
        };
        self.written.push(known);
        if let Err(e) = reject_duplicate(&arg.name, seen) {
            self.errors.push(e);
            return;
        }
        let value = &arg.value;
        let result = match name.as_str() {
            "num" | "burst" | "cost" | "time" if const_path(value).is_some() => {
                let path = const_path(value).cloned();
                match name.as_str() {
                    "num" => self.dynamic.num = path,
                    "burst" => self.dynamic.burst = path,
                    "cost" => self.dynamic.cost = path.map(Cost::Const),
                    _ => self.dynamic.time = path,
                }
                Ok(())
            }
            "cost" if !matches!(value, Expr::Lit(_)) => {
                self.dynamic.cost = Some(Cost::Expr(value.clone()));
                Ok(())
            }
            "quota" => parse_quota(value).map(|v| self.dynamic.quota = Some(v)),
            "count" => parse_count(value).map(|v| self.dynamic.count = Some(v)),
            "settle" => parse_settle(value).map(|v| self.dynamic.settle = Some(v)),
            "algo" => parse_algo(value).map(|v| self.algo = Some(v)),
            "num" => positive("num", value).map(|v| self.num = Some(v)),
            "time" => parse_time(value).map(|v| self.time = Some(v)),
            "by" => parse_by(value).map(|v| self.by = Some(v)),
            "key" => parse_key(value).map(|v| self.key = Some(v)),
            "burst" => positive("burst", value).map(|v| self.burst = Some(v)),
            "cost" => positive("cost", value).map(|v| self.cost = Some(v)),
            "scope" => parse_scope(value).map(|v| self.scope = Some(v)),
            "framework" => parse_framework(value).map(|v| self.framework = Some(v)),
            "shadow" => parse_bool("shadow", SHADOW, value).map(|v| self.shadow = Some(v)),
            "replica_ack" => {
                parse_bool("replica_ack", REPLICA_ACK, value).map(|v| self.replica_ack = Some(v))
            }
            "export" => parse_export(value).map(|v| self.export = Some(v)),
            "on_store_error" => parse_on_store_error(value).map(|v| self.on_store_error = Some(v)),
            "wait" => parse_wait(value).map(|v| self.wait = Some(v)),
            "lease" => parse_lease(value).map(|v| self.lease = Some(v)),
            "lease_max" => positive("lease_max", value).map(|v| self.lease_max = Some(v)),
            _ => unreachable!("every known name has a parser"),
        };
        if let Err(e) = result {
            self.errors.push(e);
        }
    }
}

/// The forms of one attribute decided by a `const` item or at run time.
#[derive(Debug, Clone, Default)]
pub(crate) struct DynamicArgs {
    /// `num = CONST` (a `u64`).
    pub(crate) num: Option<syn::Path>,
    /// `time = CONST` (a `std::time::Duration`).
    pub(crate) time: Option<syn::Path>,
    /// `burst = CONST` (a `u64`).
    pub(crate) burst: Option<syn::Path>,
    /// `cost = CONST` or `cost = <expression over the arguments>`.
    pub(crate) cost: Option<Cost>,
    /// `quota = "request"` or `quota = "{arg}"`.
    pub(crate) quota: Option<Spanned<QuotaArg>>,
    /// `count = "err"`, `"ok"`, `"errors"`, `"4xx"`, `"5xx"`, `"4xx,5xx"`…
    pub(crate) count: Option<Spanned<CountArg>>,
    /// `settle = |output| …` or `settle = "later"`.
    pub(crate) settle: Option<Spanned<SettleArg>>,
}

/// How a call's cost is settled after its body.
#[derive(Debug, Clone)]
pub(crate) enum SettleArg {
    /// A closure (or a function path) reading the units used from the body's output.
    After(Expr),
    /// `"later"`: the body takes its `Reservation` and settles it.
    Later,
}

const SETTLES: &str = "a closure over the function's output, `settle = |reply| reply.usage.total_tokens` (a function path works too), or \"later\" (the body takes its `Reservation` and settles it, as a streaming body must)";

/// `settle`: a closure or a function path, or `"later"`.
fn parse_settle(value: &Expr) -> syn::Result<Spanned<SettleArg>> {
    let span = value.span();
    let settle = match value {
        Expr::Closure(_) | Expr::Path(_) => SettleArg::After(value.clone()),
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) if s.value() == "later" => SettleArg::Later,
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => {
            return Err(syn::Error::new(
                s.span(),
                format!(
                    "unknown settle \"{}\": expected {SETTLES}",
                    s.value().escape_default()
                ),
            ));
        }
        _ => {
            return Err(syn::Error::new(span, format!("`settle` takes {SETTLES}")));
        }
    };
    Ok(Spanned {
        value: settle,
        span,
    })
}

/// A `cost` that is not a literal.
#[derive(Debug, Clone)]
pub(crate) enum Cost {
    /// A `const` item (or, when its one segment names a parameter, an argument: see `valid`).
    Const(syn::Path),
    /// An expression evaluated per call.
    Expr(Expr),
}

/// Where `quota` reads a caller's quota.
#[derive(Debug, Clone)]
pub(crate) enum QuotaArg {
    /// `"request"`: the `Quota` in the request extensions (handlers).
    Request,
    /// `"{arg}"` / `"{arg.field}"`: an argument.
    Arg(Vec<String>),
}

/// Which outcomes `count` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CountArg {
    /// `"err"`: plain `Err` (handlers: 4xx and 5xx).
    Err,
    /// `"ok"`: plain `Ok` (handlers: below 400).
    Ok,
    /// Status classes, bit `n` for `nxx` (handlers only).
    Status(u8),
}

/// `num = LIMIT`, `time = config::WINDOW`: a path with no generics or `self`, naming a
/// `const` item.
fn const_path(value: &Expr) -> Option<&syn::Path> {
    match value {
        Expr::Path(p)
            if p.qself.is_none()
                && p.path.segments.iter().all(|s| s.arguments.is_none())
                && !p.path.segments.iter().any(|s| s.ident == "self") =>
        {
            Some(&p.path)
        }
        _ => None,
    }
}

const QUOTAS: &str = "\"request\" (the `Quota` the auth layer put in the request extensions) or \"{arg}\" (an argument of type `Quota`, `&Quota` or `Option<Quota>`)";

fn parse_quota(value: &Expr) -> syn::Result<Spanned<QuotaArg>> {
    let lit = lit_str("quota", value, QUOTAS)?;
    let text = lit.value();
    let quota = if text == "request" {
        QuotaArg::Request
    } else {
        match parse_template(&text).as_deref() {
            Ok([Piece::Arg(path)]) => QuotaArg::Arg(path.clone()),
            _ => {
                return Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "unknown quota \"{}\": expected {QUOTAS}",
                        text.escape_default()
                    ),
                ));
            }
        }
    };
    Ok(Spanned {
        value: quota,
        span: lit.span(),
    })
}

const COUNTS: &str = "\"err\" or \"ok\" (plain functions: which results count), or for handlers \"errors\" (4xx and 5xx) or status classes such as \"4xx\", \"5xx\", \"4xx,5xx\"";

fn parse_count(value: &Expr) -> syn::Result<Spanned<CountArg>> {
    let lit = lit_str("count", value, COUNTS)?;
    let text = lit.value();
    let bad = || {
        syn::Error::new(
            lit.span(),
            format!(
                "unknown count \"{}\": expected {COUNTS}",
                text.escape_default()
            ),
        )
    };
    let count = match text.as_str() {
        "err" => CountArg::Err,
        "ok" => CountArg::Ok,
        "errors" => CountArg::Status((1 << 4) | (1 << 5)),
        classes => {
            let mut mask = 0_u8;
            for class in classes.split(',') {
                let class = class.trim().as_bytes();
                match class {
                    [d @ b'1'..=b'5', b'x', b'x'] => mask |= 1 << (d - b'0'),
                    _ => return Err(bad()),
                }
            }
            CountArg::Status(mask)
        }
    };
    Ok(Spanned {
        value: count,
        span: lit.span(),
    })
}

/// The one place duplicates are rejected: the second `name` is the error, noting the first.
fn reject_duplicate(name: &Ident, seen: &mut Vec<Ident>) -> syn::Result<()> {
    if let Some(first) = seen.iter().find(|s| *s == name) {
        let mut e = syn::Error::new(
            name.span(),
            format!("duplicate argument `{name}`: give each argument once"),
        );
        e.combine(syn::Error::new(
            first.span(),
            format!("`{name}` first given here"),
        ));
        return Err(e);
    }
    seen.push(name.clone());
    Ok(())
}

fn known_list() -> String {
    KNOWN
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn unknown_argument(name: &Ident) -> syn::Error {
    let written = name.to_string();
    let lower = written.to_ascii_lowercase();
    let suggestion = ALIASES
        .iter()
        .find(|(alias, _)| *alias == lower)
        .map(|(_, right)| *right)
        .or_else(|| {
            KNOWN
                .iter()
                .copied()
                .filter(|k| edit_distance(k, &lower) <= 2)
                .min_by_key(|k| edit_distance(k, &lower))
        });
    let mut msg = format!(
        "unknown argument `{written}`; the arguments are {}",
        known_list()
    );
    if let Some(right) = suggestion {
        msg = format!(
            "unknown argument `{written}`: did you mean `{right}`? The arguments are {}",
            known_list()
        );
    }
    syn::Error::new(name.span(), msg)
}

/// Levenshtein distance, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn lit_str(name: &str, value: &Expr, accepted: &str) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s.clone()),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{name}` takes a string: {accepted}"),
        )),
    }
}

const ALGOS: &str = "\"fixed\" (the default), \"sliding\", \"leaky\", \"token\", \"gcra\", \"sliding_counter\" or \"concurrency\" (calls in flight)";

fn parse_algo(value: &Expr) -> syn::Result<Spanned<Algo>> {
    let lit = lit_str("algo", value, ALGOS)?;
    let algo = match lit.value().as_str() {
        "fixed" => Algo::Fixed,
        "sliding" => Algo::Sliding,
        "leaky" => Algo::Leaky,
        "token" => Algo::Token,
        "gcra" => Algo::Gcra,
        "sliding_counter" => Algo::SlidingCounter,
        "concurrency" => Algo::Concurrency,
        other => {
            return Err(syn::Error::new(
                lit.span(),
                format!("unknown algo \"{other}\": expected {ALGOS}"),
            ));
        }
    };
    Ok(Spanned {
        value: algo,
        span: lit.span(),
    })
}

const ON_STORE_ERRORS: &str = "\"deny\" (refuse the call: 503, or `RateLimitError::StoreUnavailable`), \"local\" (check this limit in the process's memory) or \"allow\" (admit the call); without it, the limiter's failure policy";

/// `on_store_error`: what this limit's calls get when the store fails or times out.
fn parse_on_store_error(value: &Expr) -> syn::Result<Spanned<OnStoreError>> {
    let lit = lit_str("on_store_error", value, ON_STORE_ERRORS)?;
    let policy = match lit.value().as_str() {
        "allow" => OnStoreError::Allow,
        "deny" => OnStoreError::Deny,
        "local" => OnStoreError::Local,
        other => {
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "unknown on_store_error \"{}\": expected {ON_STORE_ERRORS}",
                    other.escape_default()
                ),
            ));
        }
    };
    Ok(Spanned {
        value: policy,
        span: lit.span(),
    })
}

/// `shadow`, `replica_ack`: the literal `true` or `false`; `meaning` says what `true` does.
fn parse_bool(name: &str, meaning: &str, value: &Expr) -> syn::Result<Spanned<bool>> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(b), ..
        }) => Ok(Spanned {
            value: b.value,
            span: b.span,
        }),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{name}` must be `true` or `false` (no quotes): `{name} = true` {meaning}"),
        )),
    }
}

/// What `shadow = true` does, for its error message.
const SHADOW: &str = "checks and counts the limit but never rejects a call";

/// What `replica_ack = true` does, for its error message.
const REPLICA_ACK: &str = "admits a call only once a replica acknowledged its count";

/// A positive integer literal (`num`, `burst`, `cost`).
fn positive(name: &str, value: &Expr) -> syn::Result<Spanned<u64>> {
    let expected = format!("`{name}` must be a positive integer, such as `{name} = 10`");
    let Expr::Lit(ExprLit {
        lit: Lit::Int(int), ..
    }) = value
    else {
        return Err(syn::Error::new(value.span(), expected));
    };
    let n: u64 = int.base10_parse().map_err(|_| {
        syn::Error::new(
            int.span(),
            format!(
                "`{name}` must be a positive integer no larger than {}",
                u64::MAX
            ),
        )
    })?;
    if n == 0 {
        return Err(syn::Error::new(
            int.span(),
            format!("`{name}` must be a positive integer, not 0"),
        ));
    }
    Ok(Spanned {
        value: n,
        span: int.span(),
    })
}

/// The forms a duration argument (`time`, `wait`) takes.
fn duration_forms(name: &str) -> String {
    format!(
        "integer seconds (`{name} = 10`) or a duration string: \"500ms\", \"10s\", \"1m\", \"1h\", \"1d\""
    )
}

/// `time`: integer seconds, or `"<n>ms|s|m|h|d"`; the result is in milliseconds.
fn parse_time(value: &Expr) -> syn::Result<Spanned<u64>> {
    let (ms, span) = parse_duration_arg("time", value)?;
    if ms == 0 {
        return Err(syn::Error::new(
            span,
            "`time` must be positive: a period of 0 admits nothing",
        ));
    }
    Ok(Spanned { value: ms, span })
}

/// The longest `wait`: an hour.
pub(crate) const MAX_WAIT_MS: u64 = 3_600_000;

/// `wait`: the longest a limited call waits for a slot, in the forms of `time`; positive and
/// at most [`MAX_WAIT_MS`]. The result is in milliseconds.
fn parse_wait(value: &Expr) -> syn::Result<Spanned<u64>> {
    let (ms, span) = parse_duration_arg("wait", value)?;
    if ms == 0 {
        return Err(syn::Error::new(
            span,
            "`wait` must be positive: it is the longest a limited call waits for a slot before it fails (remove `wait` for a call that fails at once)",
        ));
    }
    if ms > MAX_WAIT_MS {
        return Err(syn::Error::new(
            span,
            "`wait` is at most \"1h\": a call waiting longer holds its task, its caller and its place in line for that long, and hides a spent quota or an outage behind a hang; queue such work in a job scheduler instead",
        ));
    }
    Ok(Spanned { value: ms, span })
}

/// `lease`: the longest life of a lease, in the forms of `time`, from 1 ms to 1 s (the shared
/// rule). The result is in milliseconds.
fn parse_lease(value: &Expr) -> syn::Result<Spanned<u64>> {
    let (ms, span) = parse_duration_arg("lease", value)?;
    crate::rules::check_lease(crate::rules::Kind::Window, ms, 1)
        .map_err(|v| syn::Error::new(span, v.message()))?;
    Ok(Spanned { value: ms, span })
}

/// A duration argument `name`: integer seconds or a duration string, in milliseconds, and
/// the span of its literal.
fn parse_duration_arg(name: &str, value: &Expr) -> syn::Result<(u64, Span)> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => {
            let secs: u64 = int.base10_parse().map_err(|_| {
                syn::Error::new(
                    int.span(),
                    format!("`{name}` is too large; use {}", duration_forms(name)),
                )
            })?;
            let ms = secs.checked_mul(1000).ok_or_else(|| {
                syn::Error::new(
                    int.span(),
                    format!("`{name}` is too large: at most 100 years"),
                )
            })?;
            Ok((ms, int.span()))
        }
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok((parse_duration(name, &s.value(), s.span())?, s.span())),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{name}` takes {}", duration_forms(name)),
        )),
    }
}

fn parse_duration(name: &str, text: &str, span: Span) -> syn::Result<u64> {
    let bad = || {
        syn::Error::new(
            span,
            format!(
                "cannot read the duration \"{text}\": `{name}` takes {}",
                duration_forms(name)
            ),
        )
    };
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(bad());
    }
    let n: u64 = number.parse().map_err(|_| bad())?;
    let factor: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(factor)
        .ok_or_else(|| syn::Error::new(span, format!("`{name}` is too large: at most 100 years")))
}

const BYS: &str =
    "\"global\" (the default), \"ip\", \"url\", \"user\", \"app_id\" or \"header:<name>\"";

fn parse_by(value: &Expr) -> syn::Result<Spanned<By>> {
    let lit = lit_str("by", value, BYS)?;
    let text = lit.value();
    let by = match text.as_str() {
        "global" => By::Global,
        "ip" => By::Ip,
        "url" => By::Url,
        "user" => By::User,
        "app_id" => By::AppId,
        other => match other.strip_prefix("header:") {
            Some(name) => {
                let name = name.trim();
                if name.is_empty() || !name.bytes().all(is_header_name_byte) {
                    return Err(syn::Error::new(
                        lit.span(),
                        format!(
                            "invalid header name \"{name}\" in by = \"{other}\": use letters, digits and !#$%&'*+-.^_`|~, as in by = \"header:x-api-key\""
                        ),
                    ));
                }
                By::Header(name.to_ascii_lowercase())
            }
            None => {
                return Err(syn::Error::new(
                    lit.span(),
                    format!("unknown by \"{other}\": expected {BYS}"),
                ));
            }
        },
    };
    Ok(Spanned {
        value: by,
        span: lit.span(),
    })
}

/// RFC 9110 `tchar`.
fn is_header_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn parse_key(value: &Expr) -> syn::Result<KeyTemplate> {
    let lit = lit_str(
        "key",
        value,
        "a fixed key such as \"login\", or a template over the arguments such as \"sms:{phone}\"",
    )?;
    let pieces = parse_template(&lit.value()).map_err(|msg| {
        syn::Error::new(
            lit.span(),
            format!("{msg} in the key template; write {{arg}} or {{arg.field}} for an argument, {{{{ and }}}} for literal braces"),
        )
    })?;
    Ok(KeyTemplate { lit, pieces })
}

/// Splits a template into text and `{arg.field}` pieces.
pub(crate) fn parse_template(text: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut buf = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                buf.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                buf.push('}');
            }
            '}' => return Err("unmatched `}`".to_owned()),
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some('{') | None => return Err("unclosed `{`".to_owned()),
                        Some(c) => inner.push(c),
                    }
                }
                let inner = inner.trim();
                if inner.is_empty() {
                    return Err("empty `{}`".to_owned());
                }
                let path: Vec<String> = inner
                    .split('.')
                    .map(|s| s.trim().trim_start_matches("r#").to_owned())
                    .collect();
                for (i, seg) in path.iter().enumerate() {
                    let ident = seg.starts_with(|c: char| c.is_alphabetic() || c == '_')
                        && seg.chars().all(|c| c.is_alphanumeric() || c == '_');
                    let index = i > 0 && !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit());
                    if !(ident || index) {
                        return Err(format!("`{{{inner}}}` is not an argument name"));
                    }
                }
                if !buf.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut buf)));
                }
                pieces.push(Piece::Arg(path));
            }
            c => buf.push(c),
        }
    }
    if !buf.is_empty() {
        pieces.push(Piece::Text(buf));
    }
    Ok(pieces)
}

/// The same rule as `ratelimit_runtime::key::valid_scope`.
pub(crate) fn valid_scope(scope: &str) -> bool {
    !scope.is_empty()
        && scope.len() <= 200
        && scope
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b':' | b'.' | b'-' | b'/'))
}

fn parse_scope(value: &Expr) -> syn::Result<Spanned<String>> {
    let lit = lit_str("scope", value, "a bucket name such as \"sms\"")?;
    let scope = lit.value();
    if !valid_scope(&scope) {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "invalid scope \"{}\": use 1 to 200 characters of A-Z a-z 0-9 _ : . - /",
                scope.escape_default()
            ),
        ));
    }
    Ok(Spanned {
        value: scope,
        span: lit.span(),
    })
}

const EXPORTS: &str = "the name of the const that will hold this function's limits, an identifier such as `export = \"LOGIN\"`";

/// `export`: a plain identifier (not a keyword, not `_`, not raw), made an `Ident` at the
/// literal, so the const is named where the user wrote its name.
fn parse_export(value: &Expr) -> syn::Result<Ident> {
    let lit = lit_str("export", value, EXPORTS)?;
    let text = lit.value();
    match syn::parse_str::<Ident>(&text) {
        Ok(ident) if ident == text && !text.starts_with("r#") => Ok(Ident::new(&text, lit.span())),
        _ => Err(syn::Error::new(
            lit.span(),
            format!(
                "invalid export \"{}\": `export` takes {EXPORTS}",
                text.escape_default()
            ),
        )),
    }
}

fn parse_framework(value: &Expr) -> syn::Result<Spanned<Framework>> {
    let accepted = "\"axum\" or \"actix\"";
    let lit = lit_str("framework", value, accepted)?;
    let framework = match lit.value().as_str() {
        "axum" => Framework::Axum,
        "actix" | "actix-web" | "actix_web" => Framework::Actix,
        other => {
            return Err(syn::Error::new(
                lit.span(),
                format!("unknown framework \"{other}\": expected {accepted}"),
            ));
        }
    };
    Ok(Spanned {
        value: framework,
        span: lit.span(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(tokens: proc_macro2::TokenStream) -> Args {
        syn::parse2(tokens).unwrap()
    }

    #[test]
    fn reads_every_argument() {
        let a = args(quote::quote!(
            algo = "token",
            num = 5,
            time = "500ms",
            by = "header:X-Api-Key",
            key = "sms:{phone}",
            burst = 10,
            cost = 2,
            scope = "sms",
            framework = "axum"
        ));
        assert!(a.errors.is_empty(), "{:?}", a.errors);
        assert_eq!(a.algo.unwrap().value, Algo::Token);
        assert_eq!(a.num.unwrap().value, 5);
        assert_eq!(a.time.unwrap().value, 500);
        assert_eq!(a.by.unwrap().value, By::Header("x-api-key".into()));
        assert_eq!(a.key.unwrap().arg_roots(), ["phone"]);
        assert_eq!(a.burst.unwrap().value, 10);
        assert_eq!(a.cost.unwrap().value, 2);
        assert_eq!(a.scope.unwrap().value, "sms");
        assert_eq!(a.framework.unwrap().value, Framework::Axum);
    }

    #[test]
    fn replica_ack_is_a_bool_literal() {
        let a = args(quote::quote!(num = 3, time = 60, replica_ack = true));
        assert!(a.errors.is_empty(), "{:?}", a.errors);
        assert!(a.replica_ack.unwrap().value);
        let a = args(quote::quote!(num = 3, time = 60, replica_ack = "yes"));
        let message = a
            .errors
            .first()
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(
            message.contains("`replica_ack` must be `true` or `false`"),
            "{message}"
        );
    }

    #[test]
    fn on_store_error_names_a_failure_policy() {
        for (text, policy) in [
            ("deny", OnStoreError::Deny),
            ("local", OnStoreError::Local),
            ("allow", OnStoreError::Allow),
        ] {
            let a = args(quote::quote!(num = 3, time = 60, on_store_error = #text));
            assert!(a.errors.is_empty(), "{:?}", a.errors);
            assert_eq!(a.on_store_error.map(|p| p.value), Some(policy));
        }
        assert!(
            args(quote::quote!(num = 3, time = 60))
                .on_store_error
                .is_none()
        );
        for bad in [
            quote::quote!(on_store_error = "Deny"),
            quote::quote!(on_store_error = "fail_closed"),
            quote::quote!(on_store_error = deny),
            quote::quote!(on_store_error = true),
        ] {
            let a = args(bad.clone());
            assert_eq!(a.errors.len(), 1, "{bad}");
            let msg = a.errors[0].to_string();
            assert!(
                msg.contains("\"deny\"") && msg.contains("\"local\"") && msg.contains("\"allow\""),
                "{bad}: {msg}"
            );
        }
        let a = args(quote::quote!(
            on_store_error = "deny",
            on_store_error = "allow"
        ));
        assert!(
            a.errors[0]
                .to_string()
                .contains("duplicate argument `on_store_error`")
        );
    }

    #[test]
    fn run_time_forms() {
        let a = args(quote::quote!(
            num = config::ATTEMPTS,
            time = WINDOW,
            burst = BURST,
            cost = items.len(),
            count = "4xx, 5xx"
        ));
        assert!(a.errors.is_empty(), "{:?}", a.errors);
        let d = &a.dynamic;
        assert!(d.num.is_some() && d.time.is_some() && d.burst.is_some());
        assert!(matches!(d.cost, Some(Cost::Expr(_))));
        assert_eq!(
            d.count.as_ref().map(|c| c.value),
            Some(CountArg::Status(0b11_0000))
        );
        let a = args(quote::quote!(
            quota = "{self.plan}",
            cost = n,
            count = "errors"
        ));
        assert!(a.errors.is_empty(), "{:?}", a.errors);
        assert!(matches!(
            a.dynamic.quota.as_ref().map(|q| &q.value),
            Some(QuotaArg::Arg(path)) if path == &["self", "plan"]
        ));
        assert!(matches!(a.dynamic.cost, Some(Cost::Const(_))));
        assert_eq!(
            a.dynamic.count.as_ref().map(|c| c.value),
            Some(CountArg::Status(0b11_0000))
        );
        for bad in [
            quote::quote!(count = "6xx"),
            quote::quote!(count = "4xx,"),
            quote::quote!(count = "failures"),
            quote::quote!(count = err),
            quote::quote!(quota = "{a}:{b}"),
            quote::quote!(quota = "plan"),
            quote::quote!(quota = 5),
        ] {
            assert_eq!(args(bad.clone()).errors.len(), 1, "{bad}");
        }
        // A literal is still a literal, and `time` keeps its duration strings.
        let a = args(quote::quote!(num = 3, time = "1m", cost = 2));
        assert!(a.dynamic.num.is_none() && a.dynamic.cost.is_none());
        assert_eq!(a.time.map(|t| t.value), Some(60_000));
    }

    #[test]
    fn wait_takes_the_forms_of_time_up_to_an_hour() {
        let wait = |tokens| args(tokens).wait.map(|w| w.value);
        assert_eq!(
            wait(quote::quote!(num = 1, time = 1, wait = 5)),
            Some(5_000)
        );
        assert_eq!(
            wait(quote::quote!(num = 1, time = 1, wait = "250ms")),
            Some(250)
        );
        assert_eq!(
            wait(quote::quote!(num = 1, time = 1, wait = "1h")),
            Some(MAX_WAIT_MS)
        );
        for bad in [
            quote::quote!(num = 1, time = 1, wait = 0),
            quote::quote!(num = 1, time = 1, wait = "61m"),
            quote::quote!(num = 1, time = 1, wait = "soon"),
            quote::quote!(num = 1, time = 1, wait = true),
        ] {
            let a = args(bad);
            assert!(a.wait.is_none() && a.errors.len() == 1, "{:?}", a.errors);
        }
    }

    #[test]
    fn durations() {
        let s = Span::call_site();
        assert_eq!(parse_duration("time", "500ms", s).unwrap(), 500);
        assert_eq!(parse_duration("time", "10s", s).unwrap(), 10_000);
        assert_eq!(parse_duration("time", "1m", s).unwrap(), 60_000);
        assert_eq!(parse_duration("time", "1h", s).unwrap(), 3_600_000);
        assert_eq!(parse_duration("time", "1d", s).unwrap(), 86_400_000);
        assert_eq!(parse_duration("time", "7", s).unwrap(), 7_000);
        for bad in [
            "",
            "ms",
            "10x",
            "1.5s",
            "-1s",
            "10 s",
            "99999999999999999999s",
        ] {
            assert!(parse_duration("time", bad, s).is_err(), "{bad}");
        }
    }

    #[test]
    fn templates() {
        assert_eq!(
            parse_template("a{{b}}:{form.phone}{x.0}").unwrap(),
            vec![
                Piece::Text("a{b}:".into()),
                Piece::Arg(vec!["form".into(), "phone".into()]),
                Piece::Arg(vec!["x".into(), "0".into()]),
            ]
        );
        for bad in ["{", "}", "{}", "{a b}", "{0}", "{a.}", "{a{b}}"] {
            assert!(parse_template(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn collects_every_mistake() {
        let a = args(quote::quote!(
            algorithm = "x",
            num = 0,
            num = 3,
            time = "1y",
            by = "ipv4"
        ));
        assert_eq!(a.errors.len(), 5);
        let msgs: Vec<String> = a.errors.iter().map(ToString::to_string).collect();
        assert!(msgs[0].contains("did you mean `algo`"), "{msgs:?}");
        assert!(msgs[2].contains("duplicate argument `num`"), "{msgs:?}");
    }

    #[test]
    fn suggestions() {
        for (wrong, right) in [
            ("limit", "num"),
            ("period", "time"),
            ("window", "time"),
            ("nmu", "num"),
            ("scop", "scope"),
            ("failure_policy", "on_store_error"),
            ("fail_open", "on_store_error"),
            ("on_store_eror", "on_store_error"),
        ] {
            let e = unknown_argument(&Ident::new(wrong, Span::call_site())).to_string();
            assert!(
                e.contains(&format!("did you mean `{right}`")),
                "{wrong}: {e}"
            );
        }
        let e = unknown_argument(&Ident::new("zzzzzz", Span::call_site())).to_string();
        assert!(
            !e.contains("did you mean") && e.contains("`framework`"),
            "{e}"
        );
    }
}
