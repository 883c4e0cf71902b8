//! Code generation: one `static` holding the limits and one call into
//! `ratelimit_runtime::__private` before the body.
//!
//! Names and spans: generated locals are `__ratelimit_*` idents with `Span::mixed_site()`, so
//! they can neither clash with nor be seen by the user's code; everything else is spanned at
//! the call site (so clippy knows it comes from a macro) and, where a type error could arise,
//! *located* at the user's token so the compiler points there.

use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned as _;
use syn::{AttrStyle, Attribute, BinOp, Expr, FnArg, ItemFn, Meta, Pat, ReturnType, Stmt};

use crate::async_trait::{self, AsyncTrait};
use crate::attr::{Args, By, Cost, CountArg, Framework, KeyTemplate, Piece, QuotaArg, Spanned};
use crate::valid::{self, Checked, Mode};

/// The whole attribute: never fails; mistakes become `compile_error!`s next to the user's
/// function, which is emitted as written (minus the stacked `#[rate_limit]`s, which were
/// checked here) so that IDEs and the rest of the crate keep working.
#[allow(clippy::needless_pass_by_value)] // the proc-macro entry point hands over ownership
pub(crate) fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    let Ok(mut func) = syn::parse2::<ItemFn>(item.clone()) else {
        let e = syn::Error::new(
            Span::call_site(),
            "#[rate_limit] goes on an `async fn` with a body: a free function, a method, or an `async fn` in a trait impl",
        )
        .into_compile_error();
        return quote!(#item #e);
    };
    let mut all = vec![Args::from_tokens(args, Span::call_site())];
    all.extend(take_stacked(&mut func.attrs));
    let boxed = async_trait::recognise(&func);
    match valid::check(all, &func, boxed.as_ref()) {
        Ok(checked) => generate(&func, &checked, boxed.as_ref()),
        Err(e) => {
            let e = e.into_compile_error();
            quote!(#func #e)
        }
    }
}

fn is_rate_limit(attr: &Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|s| s.ident == "rate_limit")
}

/// Removes the other `#[rate_limit]` attributes on the same function and parses them: the
/// first expansion handles them all, so one call checks every limit.
fn take_stacked(attrs: &mut Vec<Attribute>) -> Vec<Args> {
    let mut stacked = Vec::new();
    attrs.retain(|attr| {
        if !is_rate_limit(attr) {
            return true;
        }
        stacked.push(match &attr.meta {
            Meta::List(list) => {
                Args::from_tokens(list.tokens.clone(), list.delimiter.span().join())
            }
            Meta::Path(path) => Args::from_tokens(TokenStream::new(), path.span()),
            Meta::NameValue(nv) => {
                let mut args = Args::empty(nv.span());
                args.errors.push(syn::Error::new(
                    nv.eq_token.span,
                    "write the arguments in parentheses: #[rate_limit(num = 10, time = 60)]",
                ));
                args.broken = true;
                args
            }
        });
        false
    });
    stacked
}

/// `::ratelimit_runtime::__private`.
fn private() -> TokenStream {
    quote!(::ratelimit_runtime::__private)
}

/// A call-site span (so lints treat the tokens as macro output) shown at `at`.
fn at(at: Span) -> Span {
    Span::call_site().located_at(at)
}

fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

fn generate(func: &ItemFn, checked: &Checked, boxed: Option<&AsyncTrait>) -> TokenStream {
    let p = private();
    let limits_ident = local("__RATELIMIT_LIMITS");
    let n = checked.limits.len();
    let fn_name = {
        let s = func.sig.ident.to_string();
        s.strip_prefix("r#").unwrap_or(&s).to_owned()
    };
    // One list of limits, written once: the check's static and the exported const (when
    // asked for) hold these same tokens, so the admin calls name exactly what is checked.
    let limits = limit_array(checked, &fn_name);
    let export = checked
        .export
        .as_ref()
        .map(|name| export_const(func, name, &fn_name, &limits));
    let dynamic = checked.limits.iter().any(valid::Limit::is_dynamic);
    let dyn_static = dynamic.then(|| dynamic_static(checked));
    let statics = quote! {
        static #limits_ident: [#p::Limit; #n] = #limits;
        #dyn_static
    };

    let http = matches!(checked.mode, Mode::Http { .. });
    let mut key_lets = Vec::new();
    let mut key_refs = Vec::new();
    for (i, limit) in checked.limits.iter().enumerate() {
        let Some(key) = &limit.key else {
            key_refs.push(quote!(::core::option::Option::None));
            continue;
        };
        if key.arg_roots().is_empty() {
            let text: String = key
                .pieces
                .iter()
                .map(|piece| match piece {
                    Piece::Text(t) => t.as_str(),
                    Piece::Arg(_) => "",
                })
                .collect();
            key_refs.push(quote!(::core::option::Option::Some(#text)));
            continue;
        }
        let ident = local(&format!("__ratelimit_key{i}"));
        let render = render(key, boxed.and_then(|b| b.self_alias.as_ref()));
        let value = if http {
            let binds = http_bindings(func, checked, key);
            quote!({ #(#binds)* #render })
        } else {
            render
        };
        key_lets.push(quote!(let #ident: ::std::string::String = #value;));
        key_refs.push(quote!(::core::option::Option::Some(#ident.as_str())));
    }

    let dynamic = dynamic.then(|| Dyn {
        inputs: inputs(func, checked, boxed, http),
        count: checked
            .limits
            .iter()
            .find_map(|l| l.dynamic.count.as_ref().map(|c| c.span)),
    });
    let item = match &checked.mode {
        Mode::Plain { ret } => plain(
            func,
            *ret,
            boxed.is_some(),
            &statics,
            &key_lets,
            &key_refs,
            dynamic.as_ref(),
        ),
        Mode::Grpc { by, request, ret } => {
            grpc(func, *by, request, *ret, &statics, &key_lets, &key_refs)
        }
        Mode::Http { http, framework } => http_handler(
            func,
            *http,
            framework.as_ref(),
            &statics,
            &key_lets,
            &key_refs,
            dynamic.as_ref(),
            reads_headers(checked),
        ),
    };
    quote!(#export #item)
}

/// `export = "NAME"`: `const NAME: &'static [Limit] = &[…];` beside the function, with its
/// visibility and its `cfg`s, holding `limits` (the tokens of the check's static). Beside a
/// free function it is an item of the module; beside a method, an associated const of the
/// impl (`Self::NAME`). The name keeps the literal's span, so that a clash or an impl that
/// cannot hold it (a trait impl: "not a member of trait") is reported there.
fn export_const(func: &ItemFn, name: &Ident, fn_name: &str, limits: &TokenStream) -> TokenStream {
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
fn limit_array(checked: &Checked, fn_name: &str) -> TokenStream {
    let p = private();
    let limits = checked.limits.iter().map(|l| limit_literal(&p, l, fn_name));
    quote!([#(#limits),*])
}

/// Whether a limit reads a header (`by = "header:…"`, `"app_id"`): otherwise the hidden
/// extractor keeps only the forwarding headers.
fn reads_headers(checked: &Checked) -> bool {
    checked
        .limits
        .iter()
        .any(|l| matches!(l.by, By::Header(_) | By::AppId))
}

/// A limit's `num`, period, `burst` and `cost` as the static's tokens: literals, or `const`
/// items written where the literal would be, located at the path so that a const of the wrong
/// type is reported there (the static's evaluation checks their values).
/// One element of the function's `static` array of limits.
fn limit_literal(p: &TokenStream, l: &valid::Limit, fn_name: &str) -> TokenStream {
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
    let failure_policy = l.on_store_error.map_or_else(
        || quote!(::core::option::Option::None),
        |policy| {
            let variant = Ident::new(policy.variant(), Span::call_site());
            quote!(::core::option::Option::Some(#p::FailurePolicy::#variant))
        },
    );
    quote! {
        #p::Limit {
            policy: #p::policy(#p::Algorithm::#algo, #num, #ms, #burst, #cost),
            scope: #scope,
            by: #by,
            shadow: #shadow,
            failure_policy: #failure_policy,
        }
    }
}

fn numbers(l: &valid::Limit) -> (TokenStream, TokenStream, TokenStream, TokenStream) {
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
fn dynamic_static(checked: &Checked) -> TokenStream {
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
        quote!(#p::Dynamic { quota: #quota, count: #count })
    });
    quote!(static #dyn_ident: [#p::Dynamic; #n] = [#(#entries),*];)
}

/// A `cost` expression with its arithmetic handed to the runtime: each `+ - * /` (through
/// parentheses) becomes a checked 128-bit operation (`__private::cost::{add, sub, mul, div}`)
/// on its operands, each widened from any primitive integer (`Units::of`), so a client's
/// argument can make a cost too large (refused), never wrap it. Anything else (a call, a
/// field, a cast, a block) is an operand, evaluated as written.
fn checked_cost(e: &Expr, p: &TokenStream) -> TokenStream {
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
fn operand(e: &Expr, p: &TokenStream) -> TokenStream {
    quote_spanned!(at(e.span())=> #p::cost::Units::of(#e))
}

/// What a function with a dynamic limit adds to the call: the per-call inputs of its limits,
/// and the span of its `count`, when it has one.
struct Dyn {
    inputs: TokenStream,
    count: Option<Span>,
}

/// `let __ratelimit_inputs = [Input { quota, cost }, …];`: each limit's quota argument and
/// cost expression, evaluated before the check (in HTTP mode through `let <pattern> =
/// &__ratelimit_argN;` for every parameter, as key templates read them).
fn inputs(func: &ItemFn, checked: &Checked, boxed: Option<&AsyncTrait>, http: bool) -> TokenStream {
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

/// `render(&[Piece::Text("sms:"), Piece::Arg(&phone)])`, with the argument expressions
/// located at the `key` literal so a type without `Display` is reported there. `self_alias`:
/// what `self` is called where the check runs (`__self` inside an `#[async_trait]` future).
fn render(key: &KeyTemplate, self_alias: Option<&Ident>) -> TokenStream {
    let p = private();
    let span = at(key.lit.span());
    let pieces = key.pieces.iter().map(|piece| match piece {
        Piece::Text(t) => quote!(#p::Piece::Text(#t)),
        Piece::Arg(path) => {
            let expr = arg_expr(path, span, self_alias);
            quote_spanned!(span=> #p::Piece::Arg(&#expr))
        }
    });
    quote!(#p::render(&[#(#pieces),*]))
}

/// `arg.field.0` from a template path, located at `span`; `self` as `self_alias` when given.
fn arg_expr(path: &[String], span: Span, self_alias: Option<&Ident>) -> TokenStream {
    {
        {
            let mut expr = TokenStream::new();
            for (i, seg) in path.iter().enumerate() {
                if i > 0 {
                    quote_spanned!(span=> .).to_tokens(&mut expr);
                }
                if seg.bytes().all(|b| b.is_ascii_digit()) {
                    syn::Index {
                        index: seg.parse().unwrap_or_default(),
                        span,
                    }
                    .to_tokens(&mut expr);
                } else if let (0, "self", Some(alias)) = (i, seg.as_str(), self_alias) {
                    // The alias's own hygiene (it names a local of async-trait's output),
                    // shown at the key literal.
                    let mut alias = alias.clone();
                    alias.set_span(alias.span().located_at(span));
                    alias.to_tokens(&mut expr);
                } else {
                    segment_ident(seg, span).to_tokens(&mut expr);
                }
            }
            expr
        }
    }
}

/// `tokens` with `self` written as `alias` (inside an `#[async_trait]` future, where the
/// receiver is a local of async-trait's), or as they are.
fn with_self_alias(tokens: TokenStream, alias: Option<&Ident>) -> TokenStream {
    let Some(alias) = alias else {
        return tokens;
    };
    tokens
        .into_iter()
        .map(|tree| match tree {
            proc_macro2::TokenTree::Ident(ident) if ident == "self" => {
                let mut alias = alias.clone();
                alias.set_span(alias.span().located_at(ident.span()));
                proc_macro2::TokenTree::Ident(alias)
            }
            proc_macro2::TokenTree::Group(group) => {
                let mut g = proc_macro2::Group::new(
                    group.delimiter(),
                    with_self_alias(group.stream(), Some(alias)),
                );
                g.set_span(group.span());
                proc_macro2::TokenTree::Group(g)
            }
            other => other,
        })
        .collect()
}

/// An identifier for a template segment: `self`, a plain name, or a raw one for a keyword.
fn segment_ident(seg: &str, span: Span) -> Ident {
    if seg == "self" || syn::parse_str::<Ident>(seg).is_ok() {
        Ident::new(seg, span)
    } else {
        Ident::new_raw(seg, span)
    }
}

/// In HTTP mode the user's parameters are moved into the inner fn, so the template reads them
/// through `let <pattern> = &__ratelimit_argN;` (binding modes stripped, since the bindings
/// become references).
fn http_bindings(func: &ItemFn, checked: &Checked, key: &KeyTemplate) -> Vec<TokenStream> {
    let roots = key.arg_roots();
    http_bindings_where(func, checked, |name| roots.contains(&name))
}

/// The bindings of the parameters that bind a name `wanted` accepts.
fn http_bindings_where(
    func: &ItemFn,
    checked: &Checked,
    wanted: impl Fn(&str) -> bool,
) -> Vec<TokenStream> {
    let typed: Vec<&syn::PatType> = func
        .sig
        .inputs
        .iter()
        .filter_map(|a| match a {
            FnArg::Typed(t) => Some(t),
            FnArg::Receiver(_) => None,
        })
        .collect();
    checked
        .params
        .iter()
        .enumerate()
        .filter(|(_, names)| names.iter().any(|n| wanted(n)))
        .map(|(i, _)| {
            let mut pat = (*typed[i].pat).clone();
            strip_binding_modes(&mut pat);
            let arg = local(&format!("__ratelimit_arg{i}"));
            quote! {
                #[allow(unused_variables, clippy::all, clippy::pedantic)]
                let #pat = &#arg;
            }
        })
        .collect()
}

fn strip_binding_modes(pat: &mut Pat) {
    match pat {
        Pat::Ident(p) => {
            p.by_ref = None;
            p.mutability = None;
            if let Some((_, sub)) = &mut p.subpat {
                strip_binding_modes(sub);
            }
        }
        Pat::Tuple(t) => t.elems.iter_mut().for_each(strip_binding_modes),
        Pat::TupleStruct(t) => t.elems.iter_mut().for_each(strip_binding_modes),
        Pat::Struct(s) => s
            .fields
            .iter_mut()
            .for_each(|f| strip_binding_modes(&mut f.pat)),
        Pat::Slice(s) => s.elems.iter_mut().for_each(strip_binding_modes),
        Pat::Reference(r) => strip_binding_modes(&mut r.pat),
        Pat::Paren(p) => strip_binding_modes(&mut p.pat),
        Pat::Type(t) => strip_binding_modes(&mut t.pat),
        _ => {}
    }
}

fn split_attrs(attrs: &[Attribute]) -> (Vec<&Attribute>, Vec<&Attribute>) {
    attrs
        .iter()
        .partition(|a| matches!(a.style, AttrStyle::Outer))
}

/// Plain mode: the signature untouched, the check prepended to the body (for an
/// `#[async_trait]` method, to the user's body inside its boxed future).
fn plain(
    func: &ItemFn,
    ret: Span,
    boxed: bool,
    statics: &TokenStream,
    key_lets: &[TokenStream],
    key_refs: &[TokenStream],
    dynamic: Option<&Dyn>,
) -> TokenStream {
    let p = private();
    let (outer, inner) = split_attrs(&func.attrs);
    let (vis, sig, stmts) = (&func.vis, &func.sig, &func.block.stmts);
    let limits = local("__RATELIMIT_LIMITS");
    let err = local("__ratelimit_error");
    // Spanned at the return type, so a missing `From<RateLimitError>` is reported there.
    let from = quote_spanned!(ret=> ::core::convert::From::from({ #err }));
    if let Some(d) = dynamic {
        let dyns = local("__RATELIMIT_DYN");
        let inputs = local("__ratelimit_inputs");
        let hold = local("__ratelimit_hold");
        let result = local("__ratelimit_result");
        let (ins, dy) = (&d.inputs, quote!(::core::option::Option::Some(&#dyns)));
        let checked_call = quote! {
            #p::check_dyn(&#limits, #dy, &[#(#key_refs),*], &#inputs).await
        };
        if d.count.is_none() {
            let check = quote! {
                #[allow(unused_braces, clippy::all, clippy::pedantic)]
                {
                    #statics
                    #(#key_lets)*
                    #ins
                    if let ::core::result::Result::Err(#err) = #checked_call {
                        return ::core::result::Result::Err(#from);
                    }
                }
            };
            return finish_plain(func, boxed, ret, check, &outer, &inner);
        }
        // `count`: taken before the body, settled after it by its result. The body runs in an
        // async block, so that its `return`s and `?`s end the block, not the function.
        let ReturnType::Type(_, ty) = &sig.output else {
            return quote!(#func);
        };
        return quote! {
            #(#outer)*
            #vis #sig {
                #(#inner)*
                #[allow(unused_braces, clippy::all, clippy::pedantic)]
                let #hold = {
                    #statics
                    #(#key_lets)*
                    #ins
                    match #checked_call {
                        ::core::result::Result::Ok(hold) => hold,
                        ::core::result::Result::Err(#err) => {
                            return ::core::result::Result::Err(#from);
                        }
                    }
                };
                #[allow(clippy::all, clippy::pedantic)]
                let #result: #ty = async {
                    let #result: #ty = { #(#stmts)* };
                    #result
                }
                .await;
                #hold.settle(#p::Outcome::of(&#result)).await;
                #result
            }
        };
    }
    let check = quote! {
        #[allow(unused_braces, clippy::all, clippy::pedantic)]
        {
            #statics
            #(#key_lets)*
            if let ::core::result::Result::Err(#err) =
                #p::check(&#limits, &[#(#key_refs),*]).await
            {
                return ::core::result::Result::Err(#from);
            }
        }
    };
    finish_plain(func, boxed, ret, check, &outer, &inner)
}

/// Plain mode: `check` first in the body (for an `#[async_trait]` method, in its future).
fn finish_plain(
    func: &ItemFn,
    boxed: bool,
    ret: Span,
    check: TokenStream,
    outer: &[&Attribute],
    inner: &[&Attribute],
) -> TokenStream {
    let (vis, sig, stmts) = (&func.vis, &func.sig, &func.block.stmts);
    if boxed {
        return into_boxed_body(func, check, ret);
    }
    quote! {
        #(#outer)*
        #vis #sig {
            #(#inner)*
            #check
            #(#stmts)*
        }
    }
}

/// Puts `check` first in the user's body inside an `#[async_trait]` method's future.
fn into_boxed_body(func: &ItemFn, check: TokenStream, ret: Span) -> TokenStream {
    let mut func = func.clone();
    // `recognise` found this site, so it is there; never emit the method unchecked.
    let Some(site) = async_trait::check_site(&mut func) else {
        let e = syn::Error::new(
            ret,
            "#[rate_limit] did not recognise this #[async_trait] body",
        )
        .into_compile_error();
        return quote!(#func #e);
    };
    site.stmts
        .insert(0, Stmt::Expr(Expr::Verbatim(check), None));
    func.into_token_stream()
}

/// gRPC mode: like plain mode inside an `#[async_trait]` future, but the caller is read from
/// the method's `tonic::Request` (synchronously, so the check's future holds no borrow of it)
/// and a refusal is a `tonic::Status`, converted into the method's error.
fn grpc(
    func: &ItemFn,
    by: Span,
    request: &Ident,
    ret: Span,
    statics: &TokenStream,
    key_lets: &[TokenStream],
    key_refs: &[TokenStream],
) -> TokenStream {
    let p = private();
    let limits = local("__RATELIMIT_LIMITS");
    let call = local("__ratelimit_call");
    let status = local("__ratelimit_status");
    let require = quote_spanned!(by=> const _: () = ::ratelimit_runtime::__private::grpc::RequireTonic::<()>::OK;);
    // Located at the parameter, so a `Request` that is not tonic's is reported there.
    let request = {
        let span = at(request.span());
        let mut r = request.clone();
        r.set_span(r.span().located_at(span));
        quote_spanned!(span=> &#r)
    };
    // Spanned at the return type, so a missing `From<Status>` is reported there.
    let from = quote_spanned!(ret=> ::ratelimit_runtime::__private::grpc::into_error(#status));
    let check = quote! {
        #[allow(unused_braces, clippy::all, clippy::pedantic)]
        {
            #require
            #statics
            #(#key_lets)*
            let #call = #p::grpc::prepare(&#limits, #request, &[#(#key_refs),*]);
            if let ::core::result::Result::Err(#status) = #p::grpc::check(&#limits, #call).await {
                return ::core::result::Result::Err(#from);
            }
        }
    };
    into_boxed_body(func, check, ret)
}

/// The hidden parameter's type, the output type and the call of an HTTP handler: `check_http`
/// for static limits (with the function's `PolicyField` static), `check_http_dyn` for dynamic
/// ones, the framework's
/// `check_http_counted` (whose output is the framework's response) with `count`.
fn http_call(
    framework: Option<&crate::attr::Spanned<Framework>>,
    dynamic: Option<&Dyn>,
    headers: bool,
    output: TokenStream,
    key_refs: &[TokenStream],
    args: &[Ident],
) -> (TokenStream, TokenStream, TokenStream) {
    let p = private();
    let caller = local("__ratelimit_caller");
    let inner = local("__ratelimit_inner");
    let limits = local("__RATELIMIT_LIMITS");
    match dynamic {
        // Without a header source, the extractor keeps only the headers `ip` may read.
        None => (quote!(#p::HttpCaller<#headers>), output, {
            // The function's `RateLimit-Policy` value, formatted on its first response.
            let policy = local("__RATELIMIT_POLICY");
            quote! {
                static #policy: #p::PolicyField = #p::PolicyField::new();
                #p::check_http(
                    &#limits,
                    &#policy,
                    #caller,
                    &[#(#key_refs),*],
                    move || #inner(#(#args),*),
                ).await
            }
        }),
        Some(d) => {
            let dyns = local("__RATELIMIT_DYN");
            let inputs = local("__ratelimit_inputs");
            let ins = &d.inputs;
            let (module, check) = match d.count {
                None => (None, quote!(#p::check_http_dyn)),
                Some(count) => {
                    let module = match framework.map(|f| f.value) {
                        Some(Framework::Axum) => quote!(#p::counted::axum),
                        Some(Framework::Actix) => quote!(#p::counted::actix),
                        None => quote!(#p::counted::default),
                    };
                    let one = framework.is_none().then(|| {
                        quote_spanned!(count=> const _: () = ::ratelimit_runtime::__private::RequireOneFramework::<()>::OK;)
                    });
                    (
                        Some((module.clone(), one)),
                        quote!(#module::check_http_counted),
                    )
                }
            };
            let call = quote! {
                #ins
                #check(
                    &#limits,
                    ::core::option::Option::Some(&#dyns),
                    #caller,
                    &[#(#key_refs),*],
                    &#inputs,
                    move || #inner(#(#args),*),
                ).await
            };
            match module {
                None => (quote!(#p::HttpCaller), output, call),
                Some((module, one)) => (
                    quote!(#module::Caller),
                    quote!(#module::Response),
                    quote!(#one #call),
                ),
            }
        }
    }
}

/// HTTP mode, as the contract with the runtime says: a hidden `HttpCaller` first, the user's
/// function moved into an inner `async fn`, and `check_http` deciding whether it runs.
#[allow(clippy::too_many_arguments)] // the pieces `generate` made, passed through
fn http_handler(
    func: &ItemFn,
    http: Span,
    framework: Option<&crate::attr::Spanned<Framework>>,
    statics: &TokenStream,
    key_lets: &[TokenStream],
    key_refs: &[TokenStream],
    dynamic: Option<&Dyn>,
    headers: bool,
) -> TokenStream {
    let p = private();
    let (outer, _) = split_attrs(&func.attrs);
    let inner_attrs = func
        .attrs
        .iter()
        .filter(|a| !matches!(a.style, AttrStyle::Outer));
    let vis = &func.vis;
    let sig = &func.sig;
    let (asyncness, fn_token, ident, generics) =
        (&sig.asyncness, &sig.fn_token, &sig.ident, &sig.generics);
    let where_clause = &generics.where_clause;
    let caller = local("__ratelimit_caller");
    let inner = local("__ratelimit_inner");

    let mut args = Vec::new();
    let mut params = Vec::new();
    for (i, input) in sig
        .inputs
        .iter()
        .filter_map(|a| match a {
            FnArg::Typed(t) => Some(t),
            FnArg::Receiver(_) => None,
        })
        .enumerate()
    {
        let arg = local(&format!("__ratelimit_arg{i}"));
        let ty = &input.ty;
        params.push(quote!(#arg: #ty));
        args.push(arg);
    }
    let output = match &sig.output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) => ty.to_token_stream(),
    };
    let mut inner_sig = sig.clone();
    inner_sig.ident = inner.clone();
    let stmts = &func.block.stmts;
    let require = match framework.map(|f| (f.value, f.span)) {
        None => {
            quote_spanned!(http=> const _: () = ::ratelimit_runtime::__private::RequireHttp::<()>::OK;)
        }
        Some((Framework::Axum, span)) => {
            quote_spanned!(span=> const _: () = ::ratelimit_runtime::__private::RequireAxum::<()>::OK;)
        }
        Some((Framework::Actix, span)) => {
            quote_spanned!(span=> const _: () = ::ratelimit_runtime::__private::RequireActix::<()>::OK;)
        }
    };
    let (caller_ty, output, call) = http_call(framework, dynamic, headers, output, key_refs, &args);
    quote! {
        #(#outer)*
        #vis #asyncness #fn_token #ident #generics (
            #caller: #caller_ty,
            #(#params),*
        ) -> #p::Limited<#output> #where_clause {
            #[allow(clippy::all, clippy::pedantic)]
            #inner_sig {
                #(#inner_attrs)*
                #(#stmts)*
            }
            #require
            #statics
            #(#key_lets)*
            #call
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(args: TokenStream, item: TokenStream) -> ItemFn {
        let out = rate_limit(args, item);
        syn::parse2(out.clone()).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    fn param_names(f: &ItemFn) -> Vec<String> {
        f.sig
            .inputs
            .iter()
            .map(|a| match a {
                FnArg::Typed(t) => t.pat.to_token_stream().to_string(),
                FnArg::Receiver(r) => r.to_token_stream().to_string(),
            })
            .collect()
    }

    fn compact(t: impl ToTokens) -> String {
        t.to_token_stream().to_string().replace(' ', "")
    }

    #[test]
    fn http_mode_follows_the_contract() {
        let f = expand(
            quote!(algo = "sliding", num = 3, time = 10, by = "ip"),
            quote! {
                /// Logs in.
                pub async fn login(State(s): State<AppState>, Json(form): Json<LoginForm>) -> impl IntoResponse { s.go(form) }
            },
        );
        assert_eq!(
            param_names(&f),
            ["__ratelimit_caller", "__ratelimit_arg0", "__ratelimit_arg1"]
        );
        assert!(f.attrs.iter().any(|a| a.path().is_ident("doc")));
        assert_eq!(
            compact(&f.sig.output),
            "->::ratelimit_runtime::__private::Limited<implIntoResponse>"
        );
        let FnArg::Typed(caller) = &f.sig.inputs[0] else {
            panic!()
        };
        assert_eq!(
            compact(&caller.ty),
            "::ratelimit_runtime::__private::HttpCaller<false>"
        );
        let body = compact(&f.block);
        assert!(
            body.contains("asyncfn__ratelimit_inner(State(s):State<AppState>,Json(form):Json<LoginForm>)->implIntoResponse{s.go(form)}"),
            "{body}"
        );
        assert!(
            body.contains("#[allow(clippy::all,clippy::pedantic)]"),
            "{body}"
        );
        assert!(body.contains("RequireHttp::<()>::OK"), "{body}");
        assert!(
            body.contains(
                "static__RATELIMIT_LIMITS:[::ratelimit_runtime::__private::Limit;1usize]"
            ),
            "{body}"
        );
        assert!(
            body.contains("policy(::ratelimit_runtime::__private::Algorithm::Sliding,3,10000,3,1)"),
            "{body}"
        );
        assert!(
            body.contains("by:::ratelimit_runtime::__private::By::Ip"),
            "{body}"
        );
        assert!(
            body.contains("static__RATELIMIT_POLICY:::ratelimit_runtime::__private::PolicyField=::ratelimit_runtime::__private::PolicyField::new();::ratelimit_runtime::__private::check_http(&__RATELIMIT_LIMITS,&__RATELIMIT_POLICY,__ratelimit_caller,&[::core::option::Option::None],move||__ratelimit_inner(__ratelimit_arg0,__ratelimit_arg1),).await"),
            "{body}"
        );
    }

    #[test]
    fn http_mode_renders_templates_from_borrowed_patterns() {
        let f = expand(
            quote!(
                num = 3,
                time = "1m",
                by = "header:X-Tenant",
                key = "login:{form.phone}",
                framework = "axum"
            ),
            quote! {
                async fn login<T: Clone>(Json(mut form): Json<LoginForm>) where T: Send {}
            },
        );
        assert_eq!(
            compact(&f.sig.output),
            "->::ratelimit_runtime::__private::Limited<()>"
        );
        assert_eq!(compact(&f.sig.generics), "<T:Clone>");
        // A header source: the hidden extractor keeps the request's headers.
        let FnArg::Typed(caller) = &f.sig.inputs[0] else {
            panic!()
        };
        assert_eq!(
            compact(&caller.ty),
            "::ratelimit_runtime::__private::HttpCaller<true>"
        );
        let body = compact(&f.block);
        assert!(body.contains("letJson(form)=&__ratelimit_arg0;"), "{body}");
        assert!(body.contains("Piece::Arg(&form.phone)"), "{body}");
        assert!(body.contains("RequireAxum::<()>::OK"), "{body}");
        assert!(body.contains("By::Header(\"x-tenant\")"), "{body}");
        assert!(
            body.contains(
                "asyncfn__ratelimit_inner<T:Clone>(Json(mutform):Json<LoginForm>)whereT:Send{}"
            ),
            "{body}"
        );
    }

    #[test]
    fn stacked_attributes_become_one_check() {
        let f = expand(
            quote!(algo = "token", num = 5, time = 1),
            quote! {
                #[rate_limit(num = 20, time = "1m")]
                #[ratelimit_runtime::rate_limit(num = 100, time = "1d", key = "sms:{phone}")]
                async fn send(&self, phone: &str) -> Result<(), E> { Ok(()) }
            },
        );
        assert!(f.attrs.is_empty());
        assert_eq!(param_names(&f), ["& self", "phone"]);
        let body = compact(&f.block);
        assert_eq!(body.matches("::check(").count(), 1, "{body}");
        assert!(body.contains("Limit;3usize]"), "{body}");
        assert!(body.contains("Piece::Arg(&phone)"), "{body}");
        assert!(body.contains("&[::core::option::Option::None,::core::option::Option::None,::core::option::Option::Some(__ratelimit_key2.as_str())]"), "{body}");
    }

    #[test]
    fn on_store_error_becomes_the_limit_s_failure_policy() {
        let f = expand(
            quote!(num = 3, time = 60, on_store_error = "deny"),
            quote! {
                #[rate_limit(num = 100, time = 60)]
                #[rate_limit(num = 10, time = 1, on_store_error = "local")]
                async fn login() -> Result<(), E> { Ok(()) }
            },
        );
        let body = compact(&f.block);
        let policies: Vec<&str> = body
            .match_indices("failure_policy:")
            .map(|(i, _)| {
                let rest = &body[i + "failure_policy:".len()..];
                &rest[..rest.find('}').unwrap_or(rest.len())]
            })
            .collect();
        assert_eq!(
            policies,
            [
                "::core::option::Option::Some(::ratelimit_runtime::__private::FailurePolicy::Deny),",
                "::core::option::Option::None,",
                "::core::option::Option::Some(::ratelimit_runtime::__private::FailurePolicy::Local),",
            ],
            "{body}"
        );
    }

    /// What `#[async_trait]` 0.1 makes of `async fn send(&mut self, (id, to): (u32, String))
    /// -> Result<u32, E> { body }` before `#[rate_limit]` runs.
    fn async_trait_shaped() -> TokenStream {
        quote! {
            #[rate_limit(num = 20, time = "1m", key = "{to}")]
            fn send<'life0, 'async_trait>(&'life0 mut self, __arg1: (u32, String))
                -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<u32, E>>
                    + ::core::marker::Send + 'async_trait>>
            where 'life0: 'async_trait, Self: 'async_trait
            {
                Box::pin(async move {
                    if let ::core::option::Option::Some(__ret) =
                        ::core::option::Option::None::<Result<u32, E>>
                    {
                        #[allow(unreachable_code)]
                        return __ret;
                    }
                    let mut __self = self;
                    let (id, to) = { let __arg1 = __arg1; __arg1 };
                    let __ret: Result<u32, E> = { __self.sent += id; body(to) };
                    #[allow(unreachable_code)]
                    __ret
                })
            }
        }
    }

    #[test]
    fn async_trait_methods_are_checked_inside_the_future_before_the_body() {
        let f = expand(
            quote!(num = 5, time = 1, key = "{self.tenant}:{id}"),
            async_trait_shaped(),
        );
        assert!(f.sig.asyncness.is_none());
        assert!(f.attrs.is_empty());
        let body = compact(&f.block);
        assert_eq!(body.matches("::check(").count(), 1, "{body}");
        assert!(body.contains("Limit;2usize]"), "{body}");
        // The receiver is read as async-trait renamed it, the pattern-bound names directly.
        assert!(body.contains("Piece::Arg(&__self.tenant)"), "{body}");
        assert!(body.contains("Piece::Arg(&id)"), "{body}");
        assert!(body.contains("Piece::Arg(&to)"), "{body}");
        // First thing in the user's body, so the arguments are bound and the body skipped.
        let user_body = body
            .split("let__ret:Result<u32,E>={")
            .nth(1)
            .unwrap_or_else(|| panic!("{body}"));
        assert!(
            user_body.starts_with(
                "#[allow(unused_braces,clippy::all,clippy::pedantic)]{static__RATELIMIT_LIMITS"
            ),
            "{user_body}"
        );
        let check_end = user_body
            .find("__self.sent+=id")
            .unwrap_or_else(|| panic!("{body}"));
        assert!(
            user_body[..check_end].contains("return::core::result::Result::Err(::core::convert::From::from({__ratelimit_error}));"),
            "{user_body}"
        );
    }

    /// What `#[tonic::async_trait]` makes of a tonic method taking `mut request`.
    fn grpc_shaped() -> TokenStream {
        quote! {
            fn say<'life0, 'async_trait>(&'life0 self, request: tonic::Request<Hello>)
                -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<Response<Reply>, Status>>
                    + ::core::marker::Send + 'async_trait>>
            where 'life0: 'async_trait, Self: 'async_trait
            {
                Box::pin(async move {
                    let __self = self;
                    let mut request = request;
                    let __ret: Result<Response<Reply>, Status> = { reply(request) };
                    #[allow(unreachable_code)]
                    __ret
                })
            }
        }
    }

    #[test]
    fn grpc_methods_read_their_request_before_the_body() {
        let f = expand(
            quote!(
                num = 5,
                time = 1,
                by = "header:X-Api-Key",
                key = "{self.tenant}"
            ),
            grpc_shaped(),
        );
        let body = compact(&f.block);
        let user_body = body
            .split("let__ret:Result<Response<Reply>,Status>={")
            .nth(1)
            .unwrap_or_else(|| panic!("{body}"));
        assert!(
            user_body.contains("grpc::RequireTonic::<()>::OK"),
            "{user_body}"
        );
        assert!(
            user_body.contains("By::Header(\"x-api-key\")"),
            "{user_body}"
        );
        assert!(
            user_body.contains("Piece::Arg(&__self.tenant)"),
            "{user_body}"
        );
        let prepare = user_body
            .find("let__ratelimit_call=::ratelimit_runtime::__private::grpc::prepare(&__RATELIMIT_LIMITS,&request,")
            .unwrap_or_else(|| panic!("{user_body}"));
        let check = user_body
            .find("grpc::check(&__RATELIMIT_LIMITS,__ratelimit_call).await")
            .unwrap_or_else(|| panic!("{user_body}"));
        let ret = user_body
            .find("return::core::result::Result::Err(::ratelimit_runtime::__private::grpc::into_error(__ratelimit_status));")
            .unwrap_or_else(|| panic!("{user_body}"));
        let body_starts = user_body.find("reply(request)").unwrap();
        assert!(
            prepare < check && check < ret && ret < body_starts,
            "{user_body}"
        );
    }

    #[test]
    fn grpc_mode_needs_a_request_and_no_url() {
        let out = rate_limit(quote!(num = 5, time = 1, by = "url"), grpc_shaped()).to_string();
        assert!(out.contains("not available on a gRPC method"), "{out}");
        // Without a `Request` parameter: the plain-mode-only error, which says what is needed.
        let plain = async_trait_shaped().to_string().replace(
            "# [rate_limit (num = 20 , time = \"1m\" , key = \"{to}\")]",
            "",
        );
        let out =
            rate_limit(quote!(num = 5, time = 1, by = "ip"), plain.parse().unwrap()).to_string();
        assert!(
            out.contains("takes no `tonic::Request<T>` parameter"),
            "{out}"
        );
    }

    #[test]
    fn a_sync_fn_that_only_returns_a_boxed_future_of_another_shape_is_not_taken_for_async_trait() {
        // Two statements: not what async-trait writes, so not recognised.
        let out = rate_limit(
            quote!(num = 5, time = 1),
            quote! {
                fn f() -> Pin<Box<dyn Future<Output = Result<(), E>> + Send>> {
                    side_effect();
                    Box::pin(async move { Ok(()) })
                }
            },
        )
        .to_string();
        assert!(out.contains("works on `async fn` only"), "{out}");
    }

    /// The output of an `export`ing attribute: the const, then the function.
    fn expand_export(args: TokenStream, item: TokenStream) -> (syn::ItemConst, ItemFn) {
        let out = rate_limit(args, item);
        let file: syn::File = syn::parse2(out.clone()).unwrap_or_else(|e| panic!("{e}: {out}"));
        match <[syn::Item; 2]>::try_from(file.items) {
            Ok([syn::Item::Const(c), syn::Item::Fn(f)]) => (c, f),
            _ => panic!("expected a const and a fn: {out}"),
        }
    }

    #[test]
    fn export_is_a_const_beside_the_function_with_the_checked_limits() {
        let (c, f) = expand_export(
            quote!(
                algo = "gcra",
                num = 2,
                time = 60,
                burst = 4,
                key = "{user}",
                export = "LOGIN"
            ),
            quote! {
                #[cfg(unix)]
                pub(crate) async fn login(user: &str) -> Result<(), E> { Ok(()) }
            },
        );
        assert_eq!(c.ident, "LOGIN");
        assert_eq!(compact(&c.vis), "pub(crate)");
        assert_eq!(
            compact(&c.ty),
            "&'static[::ratelimit_runtime::__private::Limit]"
        );
        let cfg: Vec<String> = c
            .attrs
            .iter()
            .filter(|a| a.path().is_ident("cfg"))
            .map(compact)
            .collect();
        assert_eq!(cfg, ["#[cfg(unix)]"]);
        assert!(c.attrs.iter().any(|a| a.path().is_ident("doc")));
        // The const's value is the check's static's, token for token.
        let value = compact(&c.expr);
        let array = value.strip_prefix('&').unwrap_or_else(|| panic!("{value}"));
        assert!(
            array.contains("policy(::ratelimit_runtime::__private::Algorithm::Gcra,2,60000,4,1)"),
            "{array}"
        );
        assert!(
            array.contains("::core::concat!(::core::module_path!(),\"::\",\"login\")"),
            "{array}"
        );
        let body = compact(&f.block);
        assert!(
            body.contains(&format!(
                "static__RATELIMIT_LIMITS:[::ratelimit_runtime::__private::Limit;1usize]={array};"
            )),
            "{body}"
        );
    }

    #[test]
    fn one_export_names_the_whole_stack_from_any_attribute() {
        let (c, f) = expand_export(
            quote!(num = 3, time = 60),
            quote! {
                #[rate_limit(algo = "token", num = 5, time = "1h", export = "SEND", shadow = true)]
                async fn send(&self) -> Result<(), E> { Ok(()) }
            },
        );
        assert_eq!(c.ident, "SEND");
        assert!(c.vis == syn::Visibility::Inherited);
        let value = compact(&c.expr);
        assert_eq!(value.matches("Limit{").count(), 2, "{value}");
        let fixed = value.find("Algorithm::Fixed,3,60000,3,1").unwrap();
        let token = value.find("Algorithm::Token,5,3600000,5,1").unwrap();
        assert!(fixed < token, "{value}");
        assert!(value.contains("shadow:true"), "{value}");
        assert!(compact(&f.block).contains(&format!("Limit;2usize]={};", &value[1..])));
    }

    #[test]
    fn export_mistakes_are_errors_at_the_name() {
        let out = rate_limit(
            quote!(num = 5, time = 1, export = "login-limits"),
            quote! {
                async fn f() -> Result<(), E> { Ok(()) }
            },
        )
        .to_string();
        assert!(out.contains("invalid export \\\"login-limits\\\""), "{out}");
        for bad in ["", "fn", "_", "r#x", "A B", "1A"] {
            let out = rate_limit(
                quote!(num = 5, time = 1, export = #bad),
                quote! {
                    async fn f() -> Result<(), E> { Ok(()) }
                },
            )
            .to_string();
            assert!(out.contains("invalid export"), "{bad}: {out}");
        }
        let out = rate_limit(
            quote!(num = 5, time = 1, export = "A"),
            quote! {
                #[rate_limit(num = 50, time = 60, export = "B")]
                async fn f() -> Result<(), E> { Ok(()) }
            },
        )
        .to_string();
        assert!(out.contains("one `export` names every limit"), "{out}");
        assert!(!out.contains("const"), "{out}");
        let out = rate_limit(
            quote!(quota = "{plan}", export = "A"),
            quote! { async fn f(plan: Quota) -> Result<(), E> { Ok(()) } },
        )
        .to_string();
        assert!(
            out.contains("`export` names limits fixed at compile time"),
            "{out}"
        );
        let out = rate_limit(
            quote!(num = 5, time = 1, export = "A"),
            async_trait_shaped(),
        )
        .to_string();
        assert!(
            out.contains("not available on the methods of #[async_trait]"),
            "{out}"
        );
    }

    #[test]
    fn errors_keep_the_function() {
        let out = rate_limit(
            quote!(num = 0, time = 1, by = "ipv4"),
            quote!(
                #[rate_limit(limit = 3)]
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        )
        .to_string();
        assert!(out.contains("async fn f"), "{out}");
        assert!(!out.contains("limit = 3"), "{out}");
        assert!(out.contains("positive integer, not 0"), "{out}");
        assert!(out.contains("unknown by"), "{out}");
        assert!(out.contains("did you mean `num`"), "{out}");
        assert!(out.contains("missing `time`"), "{out}");
    }
}
