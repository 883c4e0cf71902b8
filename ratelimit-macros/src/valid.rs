//! Cross-checks: the arguments of every stacked attribute against each other and against the
//! function they are on. Every rule that spans more than one argument lives here.

use proc_macro2::Span;
use syn::spanned::Spanned as _;
use syn::{FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Type};

use crate::async_trait::AsyncTrait;
use crate::attr::{
    Algo, Args, By, Cost, CountArg, DynamicArgs, Framework, KeyTemplate, OnStoreError, QuotaArg,
    Spanned,
};
use crate::pat::bound_names;
use crate::rules;

/// One checked limit, ready for code generation.
#[derive(Debug)]
pub(crate) struct Limit {
    pub(crate) algo: Algo,
    pub(crate) num: u64,
    pub(crate) period_ms: u64,
    pub(crate) burst: u64,
    pub(crate) cost: u64,
    pub(crate) by: By,
    pub(crate) key: Option<KeyTemplate>,
    pub(crate) scope: Option<String>,
    /// `const` items, run-time quotas and costs, outcome filters (the numbers above are then
    /// placeholders where these replace them).
    pub(crate) dynamic: DynamicArgs,
    /// `shadow = true`.
    pub(crate) shadow: bool,
    /// `on_store_error = "…"`.
    pub(crate) on_store_error: Option<OnStoreError>,
    /// `replica_ack = true`.
    pub(crate) replica_ack: bool,
    /// `lease = "…"` and `lease_max`: the lease's life in milliseconds and its largest take,
    /// spanned at `lease`.
    pub(crate) lease: Option<Spanned<(u64, u64)>>,
}

impl Limit {
    /// Whether the limit's numbers are known here (literals only).
    fn literal(&self) -> bool {
        let d = &self.dynamic;
        d.quota.is_none() && d.num.is_none() && d.time.is_none() && d.burst.is_none()
    }

    /// Whether the check is worked out per call (`quota`, a cost from the arguments, `count`).
    pub(crate) fn is_dynamic(&self) -> bool {
        let d = &self.dynamic;
        d.quota.is_some()
            || d.count.is_some()
            || d.settle.is_some()
            || matches!(d.cost, Some(Cost::Expr(_)))
            || self.holds_slot()
    }

    /// Whether a call holds a slot of this limit until it ends (`algo = "concurrency"`): its
    /// check is settled after the body, as a dynamic limit's is.
    pub(crate) fn holds_slot(&self) -> bool {
        self.algo == Algo::Concurrency
    }

    /// Whether `other` would share this limit's store key for every call: the runtime's key is
    /// the scope, the rendered template, the `by` value and the algorithm's parameters.
    fn same_bucket(&self, other: &Limit) -> bool {
        self.literal()
            && other.literal()
            && self.algo == other.algo
            && self.num == other.num
            && self.period_ms == other.period_ms
            && self.burst == other.burst
            && self.by == other.by
            && self.key.as_ref().map(|k| &k.pieces) == other.key.as_ref().map(|k| &k.pieces)
            && self.scope == other.scope
    }
}

/// An error when `limit` would use the same bucket as one of `earlier` (`span`: its attribute).
fn shared_bucket(earlier: &[Limit], limit: &Limit, span: Span) -> Option<syn::Error> {
    earlier.iter().any(|l| l.same_bucket(limit)).then(|| {
        syn::Error::new(
            span,
            "this limit uses the same bucket as another #[rate_limit] on this function (same algo, num, time, burst, by, key and scope): every call would be counted twice; remove one, or give it its own `scope`",
        )
    })
}

/// How the function is called.
#[derive(Debug)]
pub(crate) enum Mode {
    /// A plain async fn returning `Result`; the span is the return type's.
    Plain { ret: Span },
    /// An HTTP handler. `http` is the span of the first token that made it one (for the
    /// "needs an HTTP integration" error), `framework` the named framework, if any.
    Http {
        http: Span,
        framework: Option<Spanned<Framework>>,
    },
    /// A gRPC (tonic) method: an `#[async_trait]` method with an HTTP-like `by` and a
    /// `Request<T>` parameter. `by` is the span of that `by` (for "needs the `tonic` feature"),
    /// `request` the name the parameter is bound to in the future, `ret` the return type's
    /// span.
    Grpc { by: Span, request: Ident, ret: Span },
}

/// Everything code generation needs.
#[derive(Debug)]
pub(crate) struct Checked {
    pub(crate) limits: Vec<Limit>,
    pub(crate) mode: Mode,
    /// For each parameter (receiver excluded), the names its pattern binds.
    pub(crate) params: Vec<Vec<String>>,
    /// `export = "NAME"` (on any one of the stacked attributes): the const beside the function
    /// that holds every limit above.
    pub(crate) export: Option<Ident>,
    /// `wait = "5s"` (on any one of the stacked attributes), in milliseconds: the longest a
    /// limited call waits for a slot.
    pub(crate) wait: Option<Spanned<u64>>,
}

/// Checks every attribute's arguments (errors found while parsing them included) and the
/// function; all mistakes come back combined. `boxed` is set when `#[async_trait]` already
/// rewrote the method: its future's `Output` is then the return type to check.
pub(crate) fn check(
    attrs: Vec<Args>,
    func: &ItemFn,
    boxed: Option<&AsyncTrait>,
) -> syn::Result<Checked> {
    let mut errors: Vec<syn::Error> = Vec::new();
    let sig = &func.sig;

    if sig.asyncness.is_none() && boxed.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "#[rate_limit] works on `async fn` only: make this function `async`",
        ));
    }

    let params = param_names(sig);
    let readable = readable_names(&params, boxed);
    let receiver = sig.receiver().is_some();
    let stack = check_stack(attrs, receiver, &readable, &mut errors);

    let mode = mode_of(sig, stack.http, stack.framework, boxed, &mut errors);
    no_url_on_grpc(&mode, stack.urls, &mut errors);
    let Stack {
        limits,
        export,
        wait,
        ..
    } = stack;
    check_dynamic_mode(&limits, &mode, boxed.is_some(), &mut errors);
    check_export(export.as_ref(), boxed.is_some(), &limits, &mut errors);
    check_wait(wait.as_ref(), &mode, &mut errors);
    check_lease_alone(&limits, &mut errors);
    check_default_scope(sig, &limits, &mut errors);

    match errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        Some(e) => Err(e),
        None => Ok(Checked {
            limits,
            mode,
            params,
            export,
            wait,
        }),
    }
}

/// For each parameter (receiver excluded), the names its pattern binds.
fn param_names(sig: &syn::Signature) -> Vec<Vec<String>> {
    sig.inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(t) => {
                let mut names = Vec::new();
                bound_names(&t.pat, &mut names);
                Some(names)
            }
            FnArg::Receiver(_) => None,
        })
        .collect()
}

/// What a key template may read: the parameters, and inside an `#[async_trait]` future the
/// names its argument `let`s bind (a pattern parameter is renamed in the signature).
fn readable_names(params: &[Vec<String>], boxed: Option<&AsyncTrait>) -> Vec<Vec<String>> {
    let mut readable = params.to_vec();
    if let Some(boxed) = boxed {
        // async-trait's positional `__argN` stand for the patterns it binds in `bound`.
        for names in &mut readable {
            names.retain(|n| !crate::async_trait::is_positional(n));
        }
        readable.push(boxed.bound.clone());
    }
    readable
}

/// What the stacked attributes say together.
struct Stack {
    limits: Vec<Limit>,
    /// The first HTTP `by` or `framework`.
    http: Option<Span>,
    framework: Option<Spanned<Framework>>,
    /// The `by = "url"`s, which a gRPC method cannot have.
    urls: Vec<Span>,
    export: Option<Ident>,
    wait: Option<Spanned<u64>>,
}

/// Checks each attribute of the stack on its own and against the ones before it.
fn check_stack(
    attrs: Vec<Args>,
    receiver: bool,
    readable: &[Vec<String>],
    errors: &mut Vec<syn::Error>,
) -> Stack {
    let mut stack = Stack {
        limits: Vec::new(),
        http: None,
        framework: None,
        urls: Vec::new(),
        export: None,
        wait: None,
    };
    for mut args in attrs {
        errors.append(&mut args.errors);
        if args.broken {
            continue;
        }
        if let Some(f) = &args.framework {
            stack.http.get_or_insert(f.span);
            one_framework(&mut stack.framework, f, errors);
        }
        if let Some(by) = args.by.as_ref().filter(|b| b.value.is_http()) {
            stack.http.get_or_insert(by.span);
            if by.value == By::Url {
                stack.urls.push(by.span);
            }
        }
        take_export(&mut args, &mut stack.export, errors);
        take_wait(&mut args, &mut stack.wait, errors);
        if let Some(key) = &args.key {
            check_template(key, receiver, readable, errors);
        }
        settle_needs_cost(&args, errors);
        if let Some(mut limit) = limit_of(&args, errors) {
            limit.lease = lease_of(&args, limit.algo, errors);
            errors.extend(shared_bucket(&stack.limits, &limit, args.span));
            check_dynamic(&mut limit, receiver, readable, errors);
            stack.limits.push(limit);
        }
    }
    stack
}

/// `by = "url"` on a gRPC method: an error at each.
fn no_url_on_grpc(mode: &Mode, urls: Vec<Span>, errors: &mut Vec<syn::Error>) {
    if matches!(mode, Mode::Grpc { .. }) {
        errors.extend(urls.into_iter().map(|span| {
            syn::Error::new(
                span,
                "by = \"url\" is not available on a gRPC method: a tonic request carries no path, and every call of this method has the same one; the default scope is already per method, so use by = \"global\" (or another `by`)",
            )
        }));
    }
}

/// The default scope (the module path and the function's name) must be ASCII.
fn check_default_scope(sig: &syn::Signature, limits: &[Limit], errors: &mut Vec<syn::Error>) {
    let name = sig.ident.to_string();
    let name = name.strip_prefix("r#").unwrap_or(&name);
    if !crate::attr::valid_scope(name) && limits.iter().any(|l| l.scope.is_none()) {
        errors.push(syn::Error::new(
            sig.ident.span(),
            "the default scope is the function's module path and name, which must be ASCII: give this function a `scope = \"...\"`",
        ));
    }
}

/// The one framework of a stack: `f` when none was named yet, an error when another was.
fn one_framework(
    framework: &mut Option<Spanned<Framework>>,
    f: &Spanned<Framework>,
    errors: &mut Vec<syn::Error>,
) {
    match framework {
        Some(first) if first.value != f.value => {
            let mut e = syn::Error::new(
                f.span,
                "stacked #[rate_limit] attributes name different frameworks: a handler belongs to one framework",
            );
            e.combine(syn::Error::new(
                first.span,
                "the other framework is named here",
            ));
            errors.push(e);
        }
        Some(_) => {}
        None => *framework = Some(f.clone()),
    }
}

/// The one `export` of a stack: a second one is an error.
fn take_export(args: &mut Args, export: &mut Option<Ident>, errors: &mut Vec<syn::Error>) {
    let Some(name) = args.export.take() else {
        return;
    };
    match export {
        Some(first) => {
            let mut e = syn::Error::new(
                name.span(),
                "one `export` names every limit of this function (all its stacked #[rate_limit]s, in the order written): remove this one",
            );
            e.combine(syn::Error::new(
                first.span(),
                "the limits are exported here",
            ));
            errors.push(e);
        }
        None => *export = Some(name),
    }
}

/// The one `wait` of a stack (it bounds the whole call, every limit of it): a second one is
/// an error.
fn take_wait(args: &mut Args, wait: &mut Option<Spanned<u64>>, errors: &mut Vec<syn::Error>) {
    let Some(this) = args.wait.take() else {
        return;
    };
    match wait {
        Some(first) => {
            let mut e = syn::Error::new(
                this.span,
                "one `wait` bounds the whole call (every stacked #[rate_limit] of this function): remove this one",
            );
            e.combine(syn::Error::new(first.span, "the wait is given here"));
            errors.push(e);
        }
        None => *wait = Some(this),
    }
}

/// `wait` is for plain functions (and the plain methods of `#[async_trait]` impls): a handler
/// or a gRPC method answers its client when to come back (`Retry-After`, `RetryInfo`) instead
/// of holding the request open on the server.
fn check_wait(wait: Option<&Spanned<u64>>, mode: &Mode, errors: &mut Vec<syn::Error>) {
    let Some(wait) = wait else {
        return;
    };
    let message = match mode {
        Mode::Plain { .. } => return,
        Mode::Http { .. } => {
            "`wait` works on plain functions and the plain methods of #[async_trait] impls, not on HTTP handlers: a limited handler answers 429 with `Retry-After`, so its client waits without holding a connection and a worker here; put `wait` on the plain function that calls the limited API"
        }
        Mode::Grpc { .. } => {
            "`wait` works on plain functions and the plain methods of #[async_trait] impls, not on gRPC methods: a limited method answers RESOURCE_EXHAUSTED with a `RetryInfo` detail, so its client waits without holding a stream here; put `wait` on the plain function that calls the limited API"
        }
    };
    errors.push(syn::Error::new(wait.span, message));
}

/// Where `export` cannot name the limits: on an `#[async_trait]` method (the const would be an
/// item of a trait or trait impl, which holds the trait's items only), and beside a `quota`
/// (its limit's numbers, part of its key, come per caller at run time).
fn check_export(name: Option<&Ident>, boxed: bool, limits: &[Limit], errors: &mut Vec<syn::Error>) {
    let Some(name) = name else {
        return;
    };
    if boxed {
        errors.push(syn::Error::new(
            name.span(),
            "`export` is not available on the methods of #[async_trait] impls and traits: the const would be an item of the trait (impl), which holds the trait's items only; export from a free function or an inherent method, or name the limits with `Limit::new`",
        ));
    }
    for quota in limits.iter().filter_map(|l| l.dynamic.quota.as_ref()) {
        let mut e = syn::Error::new(
            name.span(),
            "`export` names limits fixed at compile time, but a limit with `quota` takes its num, time and burst (part of its key) from each caller at run time: name that caller's limit with `Limit::new` and the caller's quota",
        );
        e.combine(syn::Error::new(quota.span, "the quota is given here"));
        errors.push(e);
    }
}

/// Plain or HTTP, and the mistakes of that mode: a handler cannot take `self` nor be an
/// `#[async_trait]` method; a plain function returns a `Result` (the boxed future's `Output`
/// for an `#[async_trait]` method).
fn mode_of(
    sig: &syn::Signature,
    http: Option<Span>,
    framework: Option<Spanned<Framework>>,
    boxed: Option<&AsyncTrait>,
    errors: &mut Vec<syn::Error>,
) -> Mode {
    let receiver = sig.receiver().map(syn::Receiver::span);
    if let Some(http) = http {
        if let (Some(boxed), None) = (boxed, &framework) {
            return grpc_mode(sig, http, boxed, errors);
        }
        if boxed.is_some() {
            errors.push(syn::Error::new(
                http,
                "this makes the function an HTTP handler, but it is a method of an #[async_trait] impl, which #[rate_limit] supports in plain mode only: use by = \"global\" with a `key` template, or a free `async fn` handler",
            ));
        } else if let Some(recv) = receiver {
            let mut e = syn::Error::new(
                http,
                "this makes the function an HTTP handler, and handlers cannot take `self`: use a free function, or by = \"global\" with a `key` template on a method",
            );
            e.combine(syn::Error::new(recv, "`self` is taken here"));
            errors.push(e);
        }
        Mode::Http { http, framework }
    } else {
        let output = match (boxed, &sig.output) {
            (Some(b), _) => b.output.as_ref(),
            (None, ReturnType::Type(_, ty)) => Some(&**ty),
            (None, ReturnType::Default) => None,
        };
        let none = sig.paren_token.span.close();
        if let Err(e) = check_result(output, none, PLAIN_RESULT) {
            errors.push(e);
        }
        Mode::Plain {
            ret: output.map_or(none, syn::spanned::Spanned::span),
        }
    }
}

/// An `#[async_trait]` method with an HTTP-like `by` (`http` is its span): a gRPC method when
/// it takes a named `Request<T>` (tonic's, by the name: the macro cannot see types), which the
/// check reads; returning a `Result` whose error is `From<tonic::Status>`.
fn grpc_mode(
    sig: &syn::Signature,
    http: Span,
    boxed: &AsyncTrait,
    errors: &mut Vec<syn::Error>,
) -> Mode {
    let none = sig.paren_token.span.close();
    let output = boxed.output.as_ref();
    if let Err(e) = check_result(output, none, GRPC_RESULT) {
        errors.push(e);
    }
    let ret = output.map_or(none, syn::spanned::Spanned::span);
    let param = sig.inputs.iter().find_map(|arg| match arg {
        FnArg::Typed(t) if is_request(&t.ty) => Some(t),
        _ => None,
    });
    let request = match param.map(|t| &*t.pat) {
        Some(Pat::Ident(p)) if !crate::async_trait::is_positional(&p.ident.to_string()) => {
            p.ident.clone()
        }
        Some(_) => {
            let at = param.map_or(http, |t| t.pat.span());
            let mut e = syn::Error::new(
                at,
                "the `Request` parameter of a rate-limited gRPC method needs a name, which the check reads the caller from: write `request: Request<T>`",
            );
            e.combine(syn::Error::new(http, "this `by` reads the request"));
            errors.push(e);
            Ident::new("request", http)
        }
        None => {
            errors.push(syn::Error::new(
                http,
                "this `by` reads a request, but this method of an #[async_trait] impl takes no `tonic::Request<T>` parameter: a gRPC (tonic) method is limited by its `request: Request<T>` parameter; any other #[async_trait] method supports plain mode only (by = \"global\" with a `key` template)",
            ));
            Ident::new("request", http)
        }
    };
    Mode::Grpc {
        by: http,
        request,
        ret,
    }
}

/// `Request<T>`, `tonic::Request<T>`, `::tonic::Request<T>`: a path ending in `Request` with
/// one type argument.
fn is_request(ty: &Type) -> bool {
    let Type::Path(p) = ty else {
        return false;
    };
    let Some(last) = p.path.segments.last() else {
        return false;
    };
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return false;
    };
    p.qself.is_none()
        && last.ident == "Request"
        && args.args.len() == 1
        && matches!(args.args.first(), Some(GenericArgument::Type(_)))
}

const PLAIN_RESULT: &str = "a rate-limited plain function must return `Result<T, E>` with `E: From<ratelimit_runtime::RateLimitError>`, so that a rejected call can return the error";

const GRPC_RESULT: &str = "a rate-limited gRPC method must return `Result<Response<T>, E>` with `E: From<tonic::Status>` (`tonic::Status` itself, as tonic writes it), so that a rejected call can return the status";

/// The policy rules of `ratelimit_runtime::Policy::from_parts` (one file, [`rules`], compiled
/// into both crates), with spans.
fn limit_of(args: &Args, errors: &mut Vec<syn::Error>) -> Option<Limit> {
    let before = errors.len();
    let dynamic = &args.dynamic;
    if let Some(quota) = &dynamic.quota {
        return quota_limit(args, quota.span, errors);
    }
    if args.written.contains(&"quota") {
        // A `quota` that did not parse: its error says why; no "missing `num`" besides.
        return None;
    }
    missing_num_or_time(args, errors);
    let algo = args.algo.as_ref().map_or(Algo::Fixed, |a| a.value);
    if algo == Algo::Concurrency {
        concurrency_args(args, errors);
    }
    let units_ok = check_each_number(args, algo, errors);
    let consts = dynamic.num.is_some() || dynamic.time.is_some() || dynamic.burst.is_some();
    if consts {
        // The numbers are `const` items: the compiler checks the same rules when it evaluates
        // the limit's `static` (`__private::policy`), with the same messages.
        if errors.len() > before {
            return None;
        }
        return Some(const_limit(args, algo));
    }
    let (num, time) = (args.num.as_ref()?, args.time.as_ref()?);
    let burst = args.burst.as_ref().map_or(num.value, |b| b.value);
    if units_ok {
        check_scale(args, algo, num, time.value, burst, errors);
    }
    check_cost_fits(args, algo, num.value, burst, errors);
    if errors.len() > before {
        return None;
    }
    let cost = args.cost.as_ref().map_or(1, |c| c.value);
    Some(limit_with(args, algo, [num.value, time.value, burst, cost]))
}

/// `num` and `time` are required (outside `quota = …`).
fn missing_num_or_time(args: &Args, errors: &mut Vec<syn::Error>) {
    if !args.written.contains(&"num") {
        errors.push(syn::Error::new(
            args.span,
            "missing `num`: how many calls are allowed per `time`, e.g. #[rate_limit(num = 10, time = 60)]",
        ));
    }
    if !args.written.contains(&"time") {
        errors.push(syn::Error::new(
            args.span,
            "missing `time`: the period, in seconds or as \"500ms\"/\"10s\"/\"1m\"/\"1h\"/\"1d\", e.g. #[rate_limit(num = 10, time = 60)]",
        ));
    }
}

/// The rules each number obeys alone: the period's bounds, `burst` only on a bucket, `num`,
/// `burst` and `cost` within the units' bound. `false` when a number is out of that bound.
fn check_each_number(args: &Args, algo: Algo, errors: &mut Vec<syn::Error>) -> bool {
    // `num`, `time`, `burst` and `cost` are positive: `attr` rejects 0 where it parses them.
    if let Some(time) = &args.time
        && let Err(v) = rules::check_period(time.value)
    {
        errors.push(syn::Error::new(time.span, v.message()));
    }
    let burst_span = args
        .burst
        .as_ref()
        .map(|b| b.span)
        .or_else(|| path_span(args.dynamic.burst.as_ref()));
    if let Some(burst_span) = burst_span.filter(|_| !algo.kind().has_burst()) {
        errors.push(syn::Error::new(
                burst_span,
                "`burst` is the capacity of a bucket: it applies to algo = \"leaky\", \"token\" or \"gcra\" only (for the windows the capacity is `num`)",
            ));
    }
    let mut units_ok = true;
    for value in [&args.num, &args.burst, &args.cost].into_iter().flatten() {
        if let Err(v) = rules::check_units(value.value) {
            errors.push(syn::Error::new(value.span, v.message()));
            units_ok = false;
        }
    }
    units_ok
}

/// The algorithm's own bounds on `num`, `time` and `burst` together (a sliding log's size, a
/// bucket's or GCRA's scale).
fn check_scale(
    args: &Args,
    algo: Algo,
    num: &Spanned<u64>,
    period_ms: u64,
    burst: u64,
    errors: &mut Vec<syn::Error>,
) {
    if let Err(v) = rules::check_kind(algo.kind(), num.value, period_ms, burst) {
        // The burst when it is what overflows a bucket's or GCRA's scale, else `num`.
        let at = match (v, &args.burst) {
            (rules::Violation::BucketTooFine | rules::Violation::GcraTooFine, Some(b)) => b.span,
            _ => num.span,
        };
        errors.push(syn::Error::new(at, v.message()));
    }
}

/// A `cost` within the limit's capacity (`num`, or a bucket's `burst`).
fn check_cost_fits(args: &Args, algo: Algo, num: u64, burst: u64, errors: &mut Vec<syn::Error>) {
    let capacity = rules::capacity(algo.kind(), num, burst);
    if let Some(c) = &args.cost
        && let Err(v) = rules::check_cost(c.value, capacity)
    {
        let from = if algo.kind().has_burst() && args.burst.is_some() {
            "burst"
        } else {
            "num"
        };
        errors.push(syn::Error::new(
            c.span,
            format!(
                "{} (`cost` = {}, capacity {capacity} from `{from}`)",
                v.message(),
                c.value
            ),
        ));
    }
}

/// A lease is for a function's one limit: on a stack, every limit that has one is refused.
fn check_lease_alone(limits: &[Limit], errors: &mut Vec<syn::Error>) {
    if limits.len() > 1 {
        errors.extend(limits.iter().filter_map(|l| l.lease.as_ref()).map(|lease| {
            syn::Error::new(
                lease.span,
                "`lease` applies to a function's one limit: a call of stacked limits is checked at the store all or nothing, in one call; put the hot limit on a function of its own to lease it",
            )
        }));
    }
}

/// `lease = "100ms"` (and `lease_max`): the lease of a limit of `algo`, or the errors that
/// say why it cannot have one (the shared rule, and the arguments a lease cannot serve).
fn lease_of(args: &Args, algo: Algo, errors: &mut Vec<syn::Error>) -> Option<Spanned<(u64, u64)>> {
    let Some(lease) = &args.lease else {
        if let Some(max) = &args.lease_max {
            errors.push(syn::Error::new(
                max.span,
                "`lease_max` bounds the units one lease takes: it needs `lease = \"100ms\"` beside it",
            ));
        }
        return None;
    };
    let before = errors.len();
    let max = args
        .lease_max
        .as_ref()
        .map_or(rules::DEFAULT_LEASE_UNITS, |m| m.value);
    if let Err(v) = rules::check_lease(algo.kind(), lease.value, max) {
        let at = match (v, &args.lease_max) {
            (rules::Violation::LeaseUnits, Some(m)) => m.span,
            _ => lease.span,
        };
        errors.push(syn::Error::new(at, v.message()));
    }
    let after_body = [
        args.dynamic.count.as_ref().map(|c| ("count", c.span)),
        args.dynamic.settle.as_ref().map(|s| ("settle", s.span)),
    ];
    for (name, _) in after_body.into_iter().flatten() {
        errors.push(syn::Error::new(
            lease.span,
            format!("`lease` serves calls from units taken before them, and `{name}` gives a call's units back after its body by the call's own receipt: they do not combine (remove one of them)"),
        ));
    }
    if args.shadow.as_ref().is_some_and(|s| s.value) {
        errors.push(syn::Error::new(
            lease.span,
            "`lease` does not apply in shadow mode: a limit in shadow mode checks every call at the store, to count what it would reject (remove `lease` until the limit is enforced)",
        ));
    }
    (errors.len() == before).then_some(Spanned {
        value: (lease.value, max),
        span: lease.span,
    })
}

/// `algo = "concurrency"` counts calls in flight: a call holds one slot whatever it costs, and
/// releases it whatever its outcome, so `cost` and `count` do not apply.
fn concurrency_args(args: &Args, errors: &mut Vec<syn::Error>) {
    let cost = args
        .cost
        .as_ref()
        .map(|c| c.span)
        .or_else(|| match &args.dynamic.cost {
            Some(Cost::Const(path)) => path_span(Some(path)),
            Some(Cost::Expr(expr)) => Some(expr.span()),
            None => None,
        });
    if let Some(span) = cost {
        errors.push(syn::Error::new(
            span,
            "a concurrency limit holds one slot per call in flight: `cost` does not apply (leave it out, or stack a rate limit with a cost)",
        ));
    }
    if let Some(count) = &args.dynamic.count {
        errors.push(syn::Error::new(
            count.span,
            "a concurrency limit releases its slot whatever the call's outcome: `count` does not apply (put it on a stacked rate limit)",
        ));
    }
}

/// A limit whose quota comes at run time (`quota = …`): no `num`, `time` or `burst` may be
/// written beside it; the numbers here are placeholders.
fn quota_limit(args: &Args, quota: Span, errors: &mut Vec<syn::Error>) -> Option<Limit> {
    let before = errors.len();
    let dynamic = &args.dynamic;
    let given = [
        (
            "num",
            args.num
                .as_ref()
                .map(|n| n.span)
                .or_else(|| path_span(dynamic.num.as_ref())),
        ),
        (
            "time",
            args.time
                .as_ref()
                .map(|t| t.span)
                .or_else(|| path_span(dynamic.time.as_ref())),
        ),
        (
            "burst",
            args.burst
                .as_ref()
                .map(|b| b.span)
                .or_else(|| path_span(dynamic.burst.as_ref())),
        ),
    ];
    for (name, span) in given {
        if let Some(span) = span {
            let mut e = syn::Error::new(
                span,
                format!(
                    "`quota` gives this limit's num, time and burst per caller at run time: remove `{name}` (or remove `quota` for a fixed limit)"
                ),
            );
            e.combine(syn::Error::new(quota, "the quota is given here"));
            errors.push(e);
        }
    }
    let algo = args.algo.as_ref().map_or(Algo::Fixed, |a| a.value);
    if errors.len() > before {
        return None;
    }
    let cost = args.cost.as_ref().map_or(1, |c| c.value);
    if let Some(c) = &args.cost
        && let Err(v) = rules::check_units(c.value)
    {
        errors.push(syn::Error::new(c.span, v.message()));
        return None;
    }
    Some(limit_with(args, algo, [1, 1000, 1, cost]))
}

/// A limit whose numbers include `const` items: the literals it has, placeholders for the
/// rest (the static's tokens name the consts).
fn const_limit(args: &Args, algo: Algo) -> Limit {
    let numbers = [
        args.num.as_ref().map_or(1, |n| n.value),
        args.time.as_ref().map_or(1000, |t| t.value),
        // 0: the same as `num` (which may be a const).
        args.burst.as_ref().map_or(0, |b| b.value),
        args.cost.as_ref().map_or(1, |c| c.value),
    ];
    limit_with(args, algo, numbers)
}

/// The limit an attribute describes, with its numbers `[num, period_ms, burst, cost]` (the
/// lease is added by the caller).
fn limit_with(args: &Args, algo: Algo, [num, period_ms, burst, cost]: [u64; 4]) -> Limit {
    Limit {
        algo,
        num,
        period_ms,
        burst,
        cost,
        by: args.by.as_ref().map_or(By::Global, |b| b.value.clone()),
        key: args.key.clone(),
        scope: args.scope.as_ref().map(|s| s.value.clone()),
        dynamic: args.dynamic.clone(),
        shadow: args.shadow.as_ref().is_some_and(|s| s.value),
        on_store_error: args.on_store_error.as_ref().map(|p| p.value),
        replica_ack: args.replica_ack.as_ref().is_some_and(|a| a.value),
        lease: None,
    }
}

fn path_span(path: Option<&syn::Path>) -> Option<Span> {
    path.map(syn::spanned::Spanned::span)
}

/// The names a function's code may read, for messages.
fn known_names(has_self: bool, params: &[Vec<String>]) -> String {
    let mut names: Vec<String> = params.iter().flatten().map(|n| format!("`{n}`")).collect();
    if has_self {
        names.insert(0, "`self`".to_owned());
    }
    if names.is_empty() {
        "it has no arguments".to_owned()
    } else {
        format!("its arguments are {}", names.join(", "))
    }
}

/// The argument rules of the run-time forms: `quota = "{arg}"` names an argument; a `cost`
/// whose one segment names an argument is read from it per call, and a cost expression reads
/// only arguments (and items: paths of more than one segment, or upper-case names).
fn check_dynamic(
    limit: &mut Limit,
    has_self: bool,
    params: &[Vec<String>],
    errors: &mut Vec<syn::Error>,
) {
    let is_param = |name: &str| params.iter().flatten().any(|n| n == name);
    if let Some(Spanned {
        value: QuotaArg::Arg(path),
        span,
    }) = &limit.dynamic.quota
    {
        let root = path[0].as_str();
        if !((root == "self" && has_self) || is_param(root)) {
            errors.push(syn::Error::new(
                *span,
                format!(
                    "the quota reads `{{{root}}}`, but the function has no argument `{root}`: {}",
                    known_names(has_self, params)
                ),
            ));
        }
    }
    if let Some(Cost::Const(path)) = &limit.dynamic.cost
        && let Some(ident) = path.get_ident()
        && is_param(&ident.to_string())
    {
        let expr = syn::Expr::Path(syn::ExprPath {
            attrs: Vec::new(),
            qself: None,
            path: path.clone(),
        });
        limit.dynamic.cost = Some(Cost::Expr(expr));
    }
    if let Some(Cost::Expr(expr)) = &limit.dynamic.cost {
        let mut reads = Reads::default();
        syn::visit::Visit::visit_expr(&mut reads, expr);
        for ident in reads.0 {
            let name = ident.to_string();
            let lower = name.starts_with(|c: char| c.is_lowercase() || c == '_');
            if lower && !is_param(&name) && !(name == "self" && has_self) {
                errors.push(syn::Error::new(
                    ident.span(),
                    format!(
                        "the cost expression reads `{name}`, but the function has no argument `{name}`: {}",
                        known_names(has_self, params)
                    ),
                ));
            }
        }
    }
}

/// The one-segment paths an expression reads (`items` in `items.len()`), not inside closures.
#[derive(Default)]
struct Reads(Vec<syn::Ident>);

impl<'ast> syn::visit::Visit<'ast> for Reads {
    fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
        if p.qself.is_none()
            && let Some(ident) = p.path.get_ident()
        {
            self.0.push(ident.clone());
        }
    }

    fn visit_expr_closure(&mut self, _: &'ast syn::ExprClosure) {}

    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        // The receiver and the arguments, not the method's name or turbofish.
        self.visit_expr(&m.receiver);
        for arg in &m.args {
            self.visit_expr(arg);
        }
    }
}

/// The rules of the run-time forms that depend on the mode: `quota = "request"` needs a
/// request (a handler or a gRPC method), status classes a handler (a gRPC method counts its
/// results: `"err"`, `"errors"` or `"ok"`), `count` is one filter for the whole call and is
/// not available on the plain methods of `#[async_trait]` impls.
fn check_dynamic_mode(limits: &[Limit], mode: &Mode, boxed: bool, errors: &mut Vec<syn::Error>) {
    let http = matches!(mode, Mode::Http { .. });
    let grpc = matches!(mode, Mode::Grpc { .. });
    let mut first_count: Option<&Spanned<CountArg>> = None;
    let mut first_settle: Option<Span> = None;
    for limit in limits {
        if let Some(settle) = &limit.dynamic.settle {
            check_settle(settle.span, limit, mode, boxed, first_settle, errors);
            first_settle.get_or_insert(settle.span);
        }
        if let Some(Spanned {
            value: QuotaArg::Request,
            span,
        }) = &limit.dynamic.quota
            && !http
            && !grpc
        {
            errors.push(syn::Error::new(
                *span,
                "quota = \"request\" reads the `Quota` in the request extensions, so it needs an HTTP handler (by = \"user\", \"ip\"… or framework = …) or a gRPC method; a plain function takes its quota from an argument: quota = \"{plan}\"",
            ));
        }
        let Some(count) = &limit.dynamic.count else {
            continue;
        };
        if boxed && !grpc {
            errors.push(syn::Error::new(
                count.span,
                "`count` is not available on the plain methods of #[async_trait] impls (gRPC methods have it): put the limit on an `async fn` the method calls",
            ));
        }
        // `"errors"` (4xx and 5xx) is every `Err` of a gRPC method.
        let errors_mask = (1 << 4) | (1 << 5);
        if grpc && count.value == CountArg::Status(errors_mask) {
            // counted as `"err"`
        } else if !http && matches!(count.value, CountArg::Status(_)) {
            errors.push(syn::Error::new(
                count.span,
                if grpc {
                    "status classes count a handler's responses; a gRPC method counts its results: count = \"errors\" (every `Err`) or count = \"ok\""
                } else {
                    "status classes count a handler's responses; a plain function counts its results: count = \"err\" (failures only) or count = \"ok\""
                },
            ));
        }
        match first_count {
            Some(first) if first.value != count.value => {
                let mut e = syn::Error::new(
                    count.span,
                    "stacked limits of one function count the same outcomes: give every `count` the same value (a limit without `count` counts every call)",
                );
                e.combine(syn::Error::new(first.span, "the other `count` is here"));
                errors.push(e);
            }
            Some(_) => {}
            None => first_count = Some(count),
        }
    }
}

/// `settle` settles an estimate: the attribute gives one with `cost`.
fn settle_needs_cost(args: &Args, errors: &mut Vec<syn::Error>) {
    if let Some(settle) = &args.dynamic.settle
        && args.cost.is_none()
        && args.dynamic.cost.is_none()
    {
        errors.push(syn::Error::new(
            settle.span,
            "`settle` settles a call's cost to what it used: give the estimate it is charged before the body with `cost = …` (an argument such as `cost = req.max_tokens`, or a number)",
        ));
    }
}

/// `settle`: one per stack (it reads the one output of the call); not beside `count` on a
/// handler (the response it reads a status from is not the value `settle` reads); not on the
/// plain methods of `#[async_trait]` impls (as `count`).
fn check_settle(
    span: Span,
    limit: &Limit,
    mode: &Mode,
    boxed: bool,
    first: Option<Span>,
    errors: &mut Vec<syn::Error>,
) {
    if let Some(first) = first {
        let mut e = syn::Error::new(
            span,
            "one `settle` reads what the call used, for the one limit it is given on: remove this one (stacked limits that charge the same units are one limit with one `settle`)",
        );
        e.combine(syn::Error::new(first, "the settle is given here"));
        errors.push(e);
    }
    if boxed && !matches!(mode, Mode::Grpc { .. }) {
        errors.push(syn::Error::new(
            span,
            "`settle` is not available on the plain methods of #[async_trait] impls (gRPC methods have it): put the limit on an `async fn` the method calls",
        ));
    }
    if matches!(mode, Mode::Http { .. })
        && let Some(count) = &limit.dynamic.count
    {
        let mut e = syn::Error::new(
            span,
            "`settle` and `count` do not combine on a handler yet: `count` reads the response's status after the handler's value became a response, `settle` reads that value; settle to 0 for the outcomes that should not count",
        );
        e.combine(syn::Error::new(count.span, "the count is given here"));
        errors.push(e);
    }
}

fn check_template(
    key: &KeyTemplate,
    has_self: bool,
    params: &[Vec<String>],
    errors: &mut Vec<syn::Error>,
) {
    for root in key.arg_roots() {
        let found = (root == "self" && has_self) || params.iter().flatten().any(|n| n == root);
        if !found {
            let mut names: Vec<String> =
                params.iter().flatten().map(|n| format!("`{n}`")).collect();
            if has_self {
                names.insert(0, "`self`".to_owned());
            }
            let known = if names.is_empty() {
                "it has no arguments".to_owned()
            } else {
                format!("its arguments are {}", names.join(", "))
            };
            errors.push(syn::Error::new(
                key.lit.span(),
                format!("the key template reads `{{{root}}}`, but the function has no argument `{root}`: {known}"),
            ));
        }
    }
}

/// A plain function must return `Result<T, E>` (or an alias whose name ends in `Result`);
/// `output` is `None` when it returns nothing (reported at `none`).
fn check_result(output: Option<&Type>, none: Span, msg: &str) -> syn::Result<()> {
    match output {
        None => Err(syn::Error::new(
            none,
            format!("{msg}; this one returns nothing"),
        )),
        Some(ty) => {
            let ok = match ty {
                Type::Path(p) => {
                    p.qself.is_none()
                        && p.path
                            .segments
                            .last()
                            .is_some_and(|s| s.ident.to_string().ends_with("Result"))
                }
                _ => false,
            };
            if ok {
                Ok(())
            } else {
                Err(syn::Error::new(ty.span(), msg))
            }
        }
    }
}
