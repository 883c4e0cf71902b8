//! Plain mode: a function returning `Result`, checked before its body (boxed bodies of
//! `#[async_trait]` methods included).

#[allow(clippy::wildcard_imports)]
use super::*;

/// Where a plain function's check goes and how it answers.
pub(super) struct Site {
    /// The return type's span (a missing `From<RateLimitError>` is reported there).
    pub(super) ret: Span,
    /// An `#[async_trait]` method: the check goes into its boxed future.
    pub(super) boxed: bool,
    /// `wait`, in milliseconds.
    pub(super) wait: Option<u64>,
}

/// Plain mode: the signature untouched, the check prepended to the body (for an
/// `#[async_trait]` method, to the user's body inside its boxed future).
pub(super) fn plain(
    func: &ItemFn,
    site: &Site,
    statics: &TokenStream,
    key_lets: &[TokenStream],
    key_refs: &[TokenStream],
    dynamic: Option<&Dyn>,
) -> TokenStream {
    let p = private();
    let wait = site.wait.map(|ms| {
        let ms = Literal::u64_suffixed(ms);
        quote!(::core::time::Duration::from_millis(#ms))
    });
    let err = local("__ratelimit_error");
    let check = Check {
        statics,
        key_lets,
        limits: local("__RATELIMIT_LIMITS"),
        // Spanned at the return type, so a missing `From<RateLimitError>` is reported there.
        from: quote_spanned!(site.ret=> ::core::convert::From::from({ #err })),
        err,
    };
    if let Some(d) = dynamic {
        let wait = wait.map_or_else(
            || quote!(::core::option::Option::None),
            |w| quote!(::core::option::Option::Some(#w)),
        );
        return plain_dynamic(func, site, &check, key_refs, d, &wait);
    }
    let Check {
        limits, err, from, ..
    } = &check;
    let checked_call = if let Some(w) = &wait {
        quote!(#p::check_wait(&#limits, &[#(#key_refs),*], #w).await)
    } else {
        quote!(#p::check(&#limits, &[#(#key_refs),*]).await)
    };
    let check = quote! {
        #[allow(unused_braces, clippy::all, clippy::pedantic)]
        {
            #statics
            #(#key_lets)*
            if let ::core::result::Result::Err(#err) = #checked_call
            {
                return ::core::result::Result::Err(#from);
            }
        }
    };
    let (outer, inner) = split_attrs(&func.attrs);
    finish_plain(func, site.boxed, site.ret, check, &outer, &inner)
}

/// What every plain check is made of: the function's statics and key `let`s, its limits, and
/// the early return of a refused call (`err` is the refusal, `from` the function's error).
struct Check<'a> {
    statics: &'a TokenStream,
    key_lets: &'a [TokenStream],
    limits: Ident,
    err: Ident,
    from: TokenStream,
}

/// Plain mode with a dynamic limit (`quota`, `cost = <expression>`, `count`, `settle`) or a
/// concurrency limit: `check_dyn` (`wait` is its `Option<Duration>`), whose hold is dropped at
/// once, kept for the body (a concurrency slot), or settled by the body's result.
fn plain_dynamic(
    func: &ItemFn,
    site: &Site,
    check: &Check<'_>,
    key_refs: &[TokenStream],
    d: &Dyn,
    wait: &TokenStream,
) -> TokenStream {
    let p = private();
    let (ret, boxed) = (site.ret, site.boxed);
    let Check {
        statics,
        key_lets,
        limits,
        err,
        from,
    } = check;
    let dyns = local("__RATELIMIT_DYN");
    let inputs = local("__ratelimit_inputs");
    let hold = local("__ratelimit_hold");
    let result = local("__ratelimit_result");
    let (ins, dy) = (&d.inputs, quote!(::core::option::Option::Some(&#dyns)));
    let checked_call = quote! {
        #p::check_dyn(&#limits, #dy, &[#(#key_refs),*], &#inputs, #wait).await
    };
    let take_hold = quote! {
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
    };
    if d.holds && boxed && d.count.is_none() {
        // An `#[async_trait]` method: the hold lives in its boxed future, first thing in
        // the user's body, and releases the slot when that future ends or is dropped.
        return into_boxed_body(func, take_hold, ret);
    }
    let (outer, inner) = split_attrs(&func.attrs);
    if d.count.is_none() && d.settle.is_none() && !d.holds {
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
    // `count`, `settle` (or a concurrency limit): taken before the body, settled after it
    // by its result. The body runs in an async block, so that its `return`s and `?`s end
    // the block, not the function.
    let (vis, sig, stmts) = (&func.vis, &func.sig, &func.block.stmts);
    let ReturnType::Type(_, ty) = &sig.output else {
        return quote!(#func);
    };
    let run_and_settle = run_and_settle(d.settle.as_ref(), ty, stmts, &hold, &result);
    quote! {
        #(#outer)*
        #vis #sig {
            #(#inner)*
            #take_hold
            #[allow(clippy::all, clippy::pedantic)]
            #run_and_settle
            #result
        }
    }
}

/// The body of a plain function with `count` or `settle`, run in an async block (its
/// `return`s and `?`s end the block), then settled: by its result, by what `settle` reads from
/// it, or (`"later"`) by the reservation the body took.
fn run_and_settle(
    settle: Option<&SettleArg>,
    ty: &syn::Type,
    stmts: &[Stmt],
    hold: &Ident,
    result: &Ident,
) -> TokenStream {
    let p = private();
    let used_units = local("__ratelimit_used");
    match settle {
        None => quote! {
            let #result: #ty = async {
                let #result: #ty = { #(#stmts)* };
                #result
            }
            .await;
            #hold.settle(#p::Outcome::of(&#result)).await;
        },
        Some(SettleArg::After(used)) => quote! {
            let #result: #ty = async {
                let #result: #ty = { #(#stmts)* };
                #result
            }
            .await;
            let #used_units = #p::measure(&#result, #used);
            #hold.settle_to(#p::Outcome::of(&#result), #used_units).await;
        },
        Some(SettleArg::Later) => quote! {
            let #result: #ty = #hold
                .run_later(async {
                    let #result: #ty = { #(#stmts)* };
                    #result
                })
                .await;
        },
    }
}

/// Plain mode: `check` first in the body (for an `#[async_trait]` method, in its future).
pub(super) fn finish_plain(
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
pub(super) fn into_boxed_body(func: &ItemFn, check: TokenStream, ret: Span) -> TokenStream {
    edit_boxed_body(func, ret, |stmts| {
        stmts.insert(0, Stmt::Expr(Expr::Verbatim(check), None));
    })
}

/// The method with `edit` applied to the user's body inside its `#[async_trait]` future; a
/// compile error at `ret` beside the method as written if that body is not found.
pub(super) fn edit_boxed_body(
    func: &ItemFn,
    ret: Span,
    edit: impl FnOnce(&mut Vec<Stmt>),
) -> TokenStream {
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
    edit(&mut site.stmts);
    func.into_token_stream()
}
