//! HTTP mode: Axum and Actix-web handlers, with the hidden extractor and the response wrapper.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The hidden parameter's type, the output type and the call of an HTTP handler: `check_http`
/// for static limits (with the function's `PolicyField` static), `check_http_dyn` for dynamic
/// ones, `check_http_settle` with `settle`, the framework's `check_http_counted` (whose output
/// is the framework's response) with `count`.
pub(super) fn http_call(
    framework: Option<&crate::attr::Spanned<Framework>>,
    dynamic: Option<&Dyn>,
    headers: bool,
    output: TokenStream,
    key_refs: &[TokenStream],
    args: &[Ident],
) -> (TokenStream, TokenStream, TokenStream) {
    let p = private();
    match dynamic {
        // Without a header source, the extractor keeps only the headers `ip` may read.
        None => (
            quote!(#p::HttpCaller<#headers>),
            output,
            static_call(key_refs, args),
        ),
        Some(d) if d.settle.is_some() => (
            quote!(#p::HttpCaller),
            output,
            settle_call(d, key_refs, args),
        ),
        Some(d) => dynamic_call(framework, d, output, key_refs, args),
    }
}

/// Static limits: `check_http`, with the function's `RateLimit-Policy` value, formatted on its
/// first response.
fn static_call(key_refs: &[TokenStream], args: &[Ident]) -> TokenStream {
    let p = private();
    let (caller, inner) = (local("__ratelimit_caller"), local("__ratelimit_inner"));
    let limits = local("__RATELIMIT_LIMITS");
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
}

/// `settle`: the handler's future yields its output and what `settle` reads from it (with
/// `"later"`, nothing: its reservation settles).
fn settle_call(d: &Dyn, key_refs: &[TokenStream], args: &[Ident]) -> TokenStream {
    let p = private();
    let (caller, inner) = (local("__ratelimit_caller"), local("__ratelimit_inner"));
    let limits = local("__RATELIMIT_LIMITS");
    let dyns = local("__RATELIMIT_DYN");
    let inputs = local("__ratelimit_inputs");
    let out = local("__ratelimit_output");
    let units = local("__ratelimit_used");
    let ins = &d.inputs;
    let (later, handler) = match &d.settle {
        Some(SettleArg::After(used)) => (
            false,
            quote! {
                move || async move {
                    let #out = #inner(#(#args),*).await;
                    let #units = #p::measure(&#out, #used);
                    (#out, #units)
                }
            },
        ),
        _ => (
            true,
            quote!(move || async move { (#inner(#(#args),*).await, ::core::option::Option::None) }),
        ),
    };
    quote! {
        #ins
        #p::check_http_settle(
            &#limits,
            ::core::option::Option::Some(&#dyns),
            #caller,
            &[#(#key_refs),*],
            &#inputs,
            #later,
            #handler,
        ).await
    }
}

/// Dynamic limits: `check_http_dyn`, or with `count` the framework's `check_http_counted`, whose
/// caller and response types are the framework's.
fn dynamic_call(
    framework: Option<&crate::attr::Spanned<Framework>>,
    d: &Dyn,
    output: TokenStream,
    key_refs: &[TokenStream],
    args: &[Ident],
) -> (TokenStream, TokenStream, TokenStream) {
    let p = private();
    let (caller, inner) = (local("__ratelimit_caller"), local("__ratelimit_inner"));
    let limits = local("__RATELIMIT_LIMITS");
    let dyns = local("__RATELIMIT_DYN");
    let inputs = local("__ratelimit_inputs");
    let ins = &d.inputs;
    let counted = d.count.map(|count| counted_module(framework, count));
    let check = match &counted {
        None => quote!(#p::check_http_dyn),
        Some((module, _)) => quote!(#module::check_http_counted),
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
    match counted {
        None => (quote!(#p::HttpCaller), output, call),
        Some((module, one)) => (
            quote!(#module::Caller),
            quote!(#module::Response),
            quote!(#one #call),
        ),
    }
}

/// The runtime's module of `count` handlers for the framework, and, when none was named, the
/// check (spanned at `count`) that only one framework is enabled.
fn counted_module(
    framework: Option<&crate::attr::Spanned<Framework>>,
    count: Span,
) -> (TokenStream, Option<TokenStream>) {
    let p = private();
    let module = match framework.map(|f| f.value) {
        Some(Framework::Axum) => quote!(#p::counted::axum),
        Some(Framework::Actix) => quote!(#p::counted::actix),
        None => quote!(#p::counted::default),
    };
    let one = framework.is_none().then(|| {
        quote_spanned!(count=> const _: () = ::ratelimit_runtime::__private::RequireOneFramework::<()>::OK;)
    });
    (module, one)
}

/// HTTP mode, as the contract with the runtime says: a hidden `HttpCaller` first, the user's
/// function moved into an inner `async fn`, and `check_http` deciding whether it runs.
#[allow(clippy::too_many_arguments)] // the pieces `generate` made, passed through
pub(super) fn http_handler(
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
