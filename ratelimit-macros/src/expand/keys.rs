//! Key templates: rendering `key = "…"` over the arguments, and the bindings a handler's
//! parameter patterns give them.

#[allow(clippy::wildcard_imports)]
use super::*;

/// `render(&[Piece::Text("sms:"), Piece::Arg(&phone)])`, with the argument expressions
/// located at the `key` literal so a type without `Display` is reported there. `self_alias`:
/// what `self` is called where the check runs (`__self` inside an `#[async_trait]` future).
pub(super) fn render(key: &KeyTemplate, self_alias: Option<&Ident>) -> TokenStream {
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
pub(super) fn arg_expr(path: &[String], span: Span, self_alias: Option<&Ident>) -> TokenStream {
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
pub(super) fn with_self_alias(tokens: TokenStream, alias: Option<&Ident>) -> TokenStream {
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
pub(super) fn segment_ident(seg: &str, span: Span) -> Ident {
    if seg == "self" || syn::parse_str::<Ident>(seg).is_ok() {
        Ident::new(seg, span)
    } else {
        Ident::new_raw(seg, span)
    }
}

/// In HTTP mode the user's parameters are moved into the inner fn, so the template reads them
/// through `let <pattern> = &__ratelimit_argN;` (binding modes stripped, since the bindings
/// become references).
pub(super) fn http_bindings(
    func: &ItemFn,
    checked: &Checked,
    key: &KeyTemplate,
) -> Vec<TokenStream> {
    let roots = key.arg_roots();
    http_bindings_where(func, checked, |name| roots.contains(&name))
}

/// The bindings of the parameters that bind a name `wanted` accepts.
pub(super) fn http_bindings_where(
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

pub(super) fn strip_binding_modes(pat: &mut Pat) {
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
