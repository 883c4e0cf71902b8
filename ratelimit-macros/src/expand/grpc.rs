//! gRPC mode: a tonic method taking a `tonic::Request<T>`, checked from the request.

#[allow(clippy::wildcard_imports)]
use super::*;

/// gRPC mode: like plain mode inside an `#[async_trait]` future, but the caller is read from
/// the method's `tonic::Request` (synchronously, so the check's future holds no borrow of it)
/// and a refusal is a `tonic::Status`, converted into the method's error.
pub(super) fn grpc(
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
