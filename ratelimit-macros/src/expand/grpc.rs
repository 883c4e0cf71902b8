//! gRPC mode: a tonic method taking a `tonic::Request<T>`, checked from the request.

#[allow(clippy::wildcard_imports)]
use super::*;

/// gRPC mode: inside the `#[async_trait]` future, the caller is read from the method's
/// `tonic::Request` (synchronously, so the check's future holds no borrow of it), a refusal is
/// a `tonic::Status` converted into the method's error, and the user's body runs in an inner
/// `async` block whose result the admission finishes: it settles a `count = …` limit by the
/// result and adds the rate-limit metadata to an `Ok` response.
#[allow(clippy::too_many_arguments)] // the pieces `generate` made, passed through
pub(super) fn grpc(
    func: &ItemFn,
    by: Span,
    request: &Ident,
    ret: Span,
    output: Option<&syn::Type>,
    statics: &TokenStream,
    key_lets: &[TokenStream],
    key_refs: &[TokenStream],
    dynamic: Option<&Dyn>,
) -> TokenStream {
    let check = admission(by, request, ret, statics, key_lets, key_refs, dynamic);
    edit_boxed_body(func, ret, |stmts| {
        let finish = run_and_finish(stmts, output, dynamic);
        let body = quote! {
            {
                #check
                #[allow(clippy::all, clippy::pedantic)]
                #finish
            }
        };
        *stmts = vec![Stmt::Expr(Expr::Verbatim(body), None)];
    })
}

/// Before the body: `RequireTonic`, the caller read from the request and the check, whose
/// refusal returns the method's error.
fn admission(
    by: Span,
    request: &Ident,
    ret: Span,
    statics: &TokenStream,
    key_lets: &[TokenStream],
    key_refs: &[TokenStream],
    dynamic: Option<&Dyn>,
) -> TokenStream {
    let p = private();
    let limits = local("__RATELIMIT_LIMITS");
    let call = local("__ratelimit_call");
    let status = local("__ratelimit_status");
    let admission = local("__ratelimit_admission");
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
    let (ins, dyns, inputs) = match dynamic {
        Some(d) => {
            let dyns = local("__RATELIMIT_DYN");
            let inputs = local("__ratelimit_inputs");
            (
                d.inputs.clone(),
                quote!(::core::option::Option::Some(&#dyns)),
                quote!(&#inputs),
            )
        }
        None => (
            TokenStream::new(),
            quote!(::core::option::Option::None),
            quote!(&[]),
        ),
    };
    quote! {
        #[allow(unused_braces, clippy::all, clippy::pedantic)]
        let #admission = {
            #require
            #statics
            #(#key_lets)*
            #ins
            let #call = #p::grpc::prepare(&#limits, #dyns, #request, &[#(#key_refs),*], #inputs);
            match #p::grpc::check(#call).await {
                ::core::result::Result::Ok(admission) => admission,
                ::core::result::Result::Err(#status) => {
                    return ::core::result::Result::Err(#from);
                }
            }
        };
    }
}

/// The body in an inner `async` block (its `return`s and `?`s end the block, whose result is
/// the method's), then the admission finished by its result: settled by it (`count`), by what
/// `settle` reads from it, or (`"later"`) by the reservation the body took.
fn run_and_finish(
    stmts: &[Stmt],
    output: Option<&syn::Type>,
    dynamic: Option<&Dyn>,
) -> TokenStream {
    let p = private();
    let admission = local("__ratelimit_admission");
    let result = local("__ratelimit_result");
    let ty = output.map_or_else(|| quote!(_), ToTokens::to_token_stream);
    let run = quote! {
        async {
            let #result: #ty = { #(#stmts)* };
            #result
        }
    };
    match dynamic.and_then(|d| d.settle.as_ref()) {
        None => quote! {
            let #result: #ty = #run.await;
            #admission.finish(#result).await
        },
        Some(SettleArg::After(used)) => {
            let used_units = local("__ratelimit_used");
            quote! {
                let #result: #ty = #run.await;
                let #used_units = #p::measure(&#result, #used);
                #admission.finish_settled(#result, #used_units).await
            }
        }
        Some(SettleArg::Later) => quote!(#admission.run_later(#run).await),
    }
}
