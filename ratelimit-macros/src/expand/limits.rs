//! The limits' tokens: the static the check reads, the exported const, and what dynamic limits
//! work out per call (quotas, checked costs, outcome filters).

#[allow(clippy::wildcard_imports)]
use super::*;

/// `export = "NAME"`: `const NAME: &'static [Limit] = &[…];` beside the function, with its
/// visibility and its `cfg`s, holding `limits` (the tokens of the check's static). Beside a
/// free function it is an item of the module; beside a method, an associated const of the
/// impl (`Self::NAME`). The name keeps the literal's span, so that a clash or an impl that
/// cannot hold it (a trait impl: "not a member of trait") is reported there.
pub(super) fn export_const(
    func: &ItemFn,
    name: &Ident,
    fn_name: &str,
    limits: &TokenStream,
) -> TokenStream {
    let p = private();
    let vis = &func.vis;
    let cfgs = func
        .attrs
        .iter()
        .filter(|a| matches!(a.style, AttrStyle::Outer) && a.path().is_ident("cfg"));
    let doc = format!(
        "The limits `#[rate_limit]` checks on `{fn_name}`, in the order its attributes are written: name them in the admin calls (`RateLimiter::peek`, `reset`, `block`)."
    );
    // The item shown at the name, so an impl that cannot hold it points there.
    let span = at(name.span());
    let vis: TokenStream = vis
        .to_token_stream()
        .into_iter()
        .map(|mut tree| {
            tree.set_span(span);
            tree
        })
        .collect();
    quote_spanned! {span=>
        #(#cfgs)*
        #[doc = #doc]
        #vis const #name: &'static [#p::Limit] = &#limits;
    }
}

/// `[Limit { … }, …]`: the function's limits, one per attribute in the order written (the
/// default scope is `fn_name` in its module).
pub(super) fn limit_array(checked: &Checked, fn_name: &str) -> TokenStream {
    let p = private();
    let limits = checked.limits.iter().map(|l| limit_literal(&p, l, fn_name));
    quote!([#(#limits),*])
}

/// A limit's `num`, period, `burst` and `cost` as the static's tokens: literals, or `const`
/// items written where the literal would be, located at the path so that a const of the wrong
/// type is reported there (the static's evaluation checks their values).
/// One element of the function's `static` array of limits.
pub(super) fn limit_literal(p: &TokenStream, l: &valid::Limit, fn_name: &str) -> TokenStream {
    let algo = Ident::new(l.algo.variant(), Span::call_site());
    let (num, ms, burst, cost) = numbers(l);
    let scope = l.scope.as_ref().map_or_else(
        || quote!(::core::concat!(::core::module_path!(), "::", #fn_name)),
        |s| quote!(#s),
    );
    let by = match &l.by {
        By::Global => quote!(#p::By::Global),
        By::Ip => quote!(#p::By::Ip),
        By::Url => quote!(#p::By::Url),
        By::User => quote!(#p::By::User),
        By::AppId => quote!(#p::By::AppId),
        By::Header(h) => quote!(#p::By::Header(#h)),
    };
    let shadow = l.shadow;
    let replica_ack = l.replica_ack;
    let failure_policy = l.on_store_error.map_or_else(
        || quote!(::core::option::Option::None),
        |policy| {
            let variant = Ident::new(policy.variant(), Span::call_site());
            quote!(::core::option::Option::Some(#p::FailurePolicy::#variant))
        },
    );
    let lease = l.lease.as_ref().map_or_else(
        || quote!(::core::option::Option::None),
        |lease| {
            let (ttl_ms, max) = lease.value;
            quote!(::core::option::Option::Some(#p::Lease::checked(#p::Algorithm::#algo, #ttl_ms, #max)))
        },
    );
    quote! {
        #p::Limit {
            policy: #p::policy(#p::Algorithm::#algo, #num, #ms, #burst, #cost),
            scope: #scope,
            by: #by,
            shadow: #shadow,
            failure_policy: #failure_policy,
            lease: #lease,
            replica_ack: #replica_ack,
        }
    }
}

pub(super) fn numbers(l: &valid::Limit) -> (TokenStream, TokenStream, TokenStream, TokenStream) {
    let p = private();
    let d = &l.dynamic;
    let units = |path: &syn::Path| {
        let v = local("__ratelimit_units");
        quote_spanned!(at(path.span())=> { let #v: u64 = #path; #v })
    };
    let num = d
        .num
        .as_ref()
        .map_or_else(|| Literal::u64_unsuffixed(l.num).into_token_stream(), units);
    let ms = d.time.as_ref().map_or_else(
        || Literal::u64_unsuffixed(l.period_ms).into_token_stream(),
        |path| {
            let v = local("__ratelimit_period");
            quote_spanned!(at(path.span())=> {
                let #v: ::core::time::Duration = #path;
                #p::period_ms(#v)
            })
        },
    );
    let burst = match &d.burst {
        Some(path) => units(path),
        None if l.burst == 0 => num.clone(),
        None => Literal::u64_unsuffixed(l.burst).into_token_stream(),
    };
    let cost = match (&d.cost, &d.quota) {
        (Some(Cost::Const(path)), None) => units(path),
        // A quota's limit, or a cost from the arguments: given per call.
        (Some(_), _) | (None, Some(_)) => quote!(1),
        (None, None) => Literal::u64_unsuffixed(l.cost).into_token_stream(),
    };
    (num, ms, burst, cost)
}

/// `static __RATELIMIT_DYN: [Dynamic; n]`: where each limit's quota comes from and which
/// outcomes it counts.
pub(super) fn dynamic_static(checked: &Checked) -> TokenStream {
    let p = private();
    let n = checked.limits.len();
    let dyn_ident = local("__RATELIMIT_DYN");
    let entries = checked.limits.iter().map(|l| {
        let quota = match l.dynamic.quota.as_ref().map(|q| &q.value) {
            None => quote!(#p::QuotaFrom::Attribute),
            Some(QuotaArg::Request) => quote!(#p::QuotaFrom::Request),
            Some(QuotaArg::Arg(_)) => quote!(#p::QuotaFrom::Argument),
        };
        let count = match l.dynamic.count.as_ref().map(|c| c.value) {
            None => quote!(#p::Count::All),
            Some(CountArg::Err) => quote!(#p::Count::Err),
            Some(CountArg::Ok) => quote!(#p::Count::Ok),
            Some(CountArg::Status(mask)) => {
                let mask = Literal::u8_unsuffixed(mask);
                quote!(#p::Count::Status(#mask))
            }
        };
        let settle = l.dynamic.settle.is_some();
        quote!(#p::Dynamic { quota: #quota, count: #count, settle: #settle })
    });
    quote!(static #dyn_ident: [#p::Dynamic; #n] = [#(#entries),*];)
}

/// A `cost` expression with its arithmetic handed to the runtime: each `+ - * /` (through
/// parentheses) becomes a checked 128-bit operation (`__private::cost::{add, sub, mul, div}`)
/// on its operands, each widened from any primitive integer (`Units::of`), so a client's
/// argument can make a cost too large (refused), never wrap it. Anything else (a call, a
/// field, a cast, a block) is an operand, evaluated as written.
pub(super) fn checked_cost(e: &Expr, p: &TokenStream) -> TokenStream {
    match e {
        Expr::Paren(inner) => checked_cost(&inner.expr, p),
        Expr::Binary(b) => {
            let op = match b.op {
                BinOp::Add(_) => "add",
                BinOp::Sub(_) => "sub",
                BinOp::Mul(_) => "mul",
                BinOp::Div(_) => "div",
                _ => return operand(e, p),
            };
            let op = Ident::new(op, b.op.span());
            let (left, right) = (checked_cost(&b.left, p), checked_cost(&b.right, p));
            quote_spanned!(at(b.op.span())=> #p::cost::#op(#left, #right))
        }
        _ => operand(e, p),
    }
}

/// One operand of a cost expression, widened to the runtime's `Units`.
pub(super) fn operand(e: &Expr, p: &TokenStream) -> TokenStream {
    quote_spanned!(at(e.span())=> #p::cost::Units::of(#e))
}

/// What a function with a dynamic limit adds to the call: the per-call inputs of its limits,
/// and the span of its `count`, when it has one.
pub(super) struct Dyn {
    pub(super) inputs: TokenStream,
    pub(super) count: Option<Span>,
    /// `settle = …`, when a limit has one.
    pub(super) settle: Option<SettleArg>,
    /// Some limit is a concurrency limit: the call's slot is released after the body.
    pub(super) holds: bool,
}

/// `let __ratelimit_inputs = [Input { quota, cost }, …];`: each limit's quota argument and
/// cost expression, evaluated before the check (in HTTP mode through `let <pattern> =
/// &__ratelimit_argN;` for every parameter, as key templates read them).
pub(super) fn inputs(
    func: &ItemFn,
    checked: &Checked,
    boxed: Option<&AsyncTrait>,
    http: bool,
) -> TokenStream {
    let p = private();
    let self_alias = boxed.and_then(|b| b.self_alias.as_ref());
    let entries = checked.limits.iter().map(|l| {
        let quota = if let Some(Spanned {
            value: QuotaArg::Arg(path),
            span,
        }) = &l.dynamic.quota
        {
            let expr = arg_expr(path, at(*span), self_alias);
            quote_spanned!(at(*span)=> #p::quota_of(&#expr))
        } else {
            quote!(::core::option::Option::None)
        };
        let cost = match (&l.dynamic.cost, &l.dynamic.quota) {
            (Some(Cost::Expr(e)), _) => {
                let e = with_self_alias(checked_cost(e, &p), self_alias);
                quote_spanned!(at(e.span())=> ::core::option::Option::Some(#p::cost_of(#e)))
            }
            (Some(Cost::Const(path)), Some(_)) => {
                quote_spanned!(at(path.span())=> ::core::option::Option::Some(#p::cost_of(#path)))
            }
            (None, Some(_)) if l.cost != 1 => {
                let c = Literal::u64_suffixed(l.cost);
                quote!(::core::option::Option::Some(#p::cost_of(#c)))
            }
            _ => quote!(::core::option::Option::None),
        };
        quote!(#p::Input { quota: #quota, cost: #cost })
    });
    let binds = if http {
        http_bindings_where(func, checked, |_| true)
    } else {
        Vec::new()
    };
    let ident = local("__ratelimit_inputs");
    quote! {
        let #ident = {
            #(#binds)*
            [#(#entries),*]
        };
    }
}
