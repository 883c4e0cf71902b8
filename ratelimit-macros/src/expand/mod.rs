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
use crate::attr::{
    Args, By, Cost, CountArg, Framework, KeyTemplate, Piece, QuotaArg, SettleArg, Spanned,
};
use crate::valid::{self, Checked, Mode};

mod grpc;
mod http;
mod keys;
mod limits;
mod plain;

// The rooms share their helpers through this module: each `use super::*`, and these bring
// every room's items here.
#[allow(clippy::wildcard_imports)]
use self::{grpc::*, http::*, keys::*, limits::*, plain::*};

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
    let (key_lets, key_refs) = keys(func, checked, boxed, http);
    let dynamic = dynamic.then(|| dyn_of(func, checked, boxed, http));
    let item = match &checked.mode {
        Mode::Plain { ret } => plain(
            func,
            &Site {
                ret: *ret,
                boxed: boxed.is_some(),
                wait: checked.wait.as_ref().map(|w| w.value),
            },
            &statics,
            &key_lets,
            &key_refs,
            dynamic.as_ref(),
        ),
        Mode::Grpc { by, request, ret } => grpc(
            func,
            *by,
            request,
            *ret,
            boxed.and_then(|b| b.output.as_ref()),
            &statics,
            &key_lets,
            &key_refs,
            dynamic.as_ref(),
        ),
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

/// Each limit's key for the check: `let`s rendering its template (before the check) and the
/// references the check takes, `None` for a limit without a key, a literal for a fixed one.
fn keys(
    func: &ItemFn,
    checked: &Checked,
    boxed: Option<&AsyncTrait>,
    http: bool,
) -> (Vec<TokenStream>, Vec<TokenStream>) {
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
    (key_lets, key_refs)
}

/// What a function with a dynamic limit passes and settles: its inputs, and the stack's
/// `count`, `settle` and concurrency slot.
fn dyn_of(func: &ItemFn, checked: &Checked, boxed: Option<&AsyncTrait>, http: bool) -> Dyn {
    Dyn {
        inputs: inputs(func, checked, boxed, http),
        count: checked
            .limits
            .iter()
            .find_map(|l| l.dynamic.count.as_ref().map(|c| c.span)),
        settle: checked
            .limits
            .iter()
            .find_map(|l| l.dynamic.settle.as_ref().map(|s| s.value.clone())),
        holds: checked.limits.iter().any(valid::Limit::holds_slot),
    }
}

/// Whether a limit reads a header (`by = "header:…"`, `"app_id"`): otherwise the hidden
/// extractor keeps only the forwarding headers.
fn reads_headers(checked: &Checked) -> bool {
    checked
        .limits
        .iter()
        .any(|l| matches!(l.by, By::Header(_) | By::AppId))
}

fn split_attrs(attrs: &[Attribute]) -> (Vec<&Attribute>, Vec<&Attribute>) {
    attrs
        .iter()
        .partition(|a| matches!(a.style, AttrStyle::Outer))
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
                &rest[..rest.find("lease:").unwrap_or(rest.len())]
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

    /// `lease` and `lease_max` become the limit's `Lease`, checked again at compile time by
    /// the runtime's const fn (the shared rule); without them a limit has none.
    #[test]
    fn lease_becomes_the_limit_s_lease() {
        let f = expand(
            quote!(num = 1000, time = 60, lease = "100ms", lease_max = 50),
            quote! { async fn search() -> Result<(), E> { Ok(()) } },
        );
        let body = compact(&f.block);
        assert!(
            body.contains("lease:::core::option::Option::Some(::ratelimit_runtime::__private::Lease::checked(::ratelimit_runtime::__private::Algorithm::Fixed,100u64,50u64))"),
            "{body}"
        );
        let f = expand(
            quote!(num = 1000, time = 60),
            quote! { async fn search() -> Result<(), E> { Ok(()) } },
        );
        assert!(compact(&f.block).contains("lease:::core::option::Option::None"));
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
            .find("let__ratelimit_call=::ratelimit_runtime::__private::grpc::prepare(&__RATELIMIT_LIMITS,::core::option::Option::None,&request,")
            .unwrap_or_else(|| panic!("{user_body}"));
        let check = user_body
            .find("grpc::check(__ratelimit_call).await")
            .unwrap_or_else(|| panic!("{user_body}"));
        let ret = user_body
            .find("return::core::result::Result::Err(::ratelimit_runtime::__private::grpc::into_error(__ratelimit_status));")
            .unwrap_or_else(|| panic!("{user_body}"));
        // The body runs in an inner block typed as the method's result, which the admission
        // finishes (the `count` settlement, the admitted response's metadata).
        let body_starts = user_body
            .find("let__ratelimit_result:Result<Response<Reply>,Status>=async{let__ratelimit_result:Result<Response<Reply>,Status>={reply(request)};__ratelimit_result}.await;")
            .unwrap_or_else(|| panic!("{user_body}"));
        let finish = user_body
            .find("__ratelimit_admission.finish(__ratelimit_result).await")
            .unwrap_or_else(|| panic!("{user_body}"));
        assert!(
            prepare < check && check < ret && ret < body_starts && body_starts < finish,
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
