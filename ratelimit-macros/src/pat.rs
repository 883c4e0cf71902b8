//! Names a parameter pattern binds, shared by `async_trait` (the argument `let`s inside the
//! boxed future) and `valid` (the function's parameters): both read patterns, neither reads the
//! other's items for it.

use syn::Pat;

/// The names a parameter pattern binds (`phone`, `Json(form)` → `form`, `(a, b)` → `a`, `b`).
pub(crate) fn bound_names(pat: &Pat, out: &mut Vec<String>) {
    match pat {
        Pat::Ident(p) => {
            out.push(syn::ext::IdentExt::unraw(&p.ident).to_string());
            if let Some((_, sub)) = &p.subpat {
                bound_names(sub, out);
            }
        }
        Pat::Tuple(t) => t.elems.iter().for_each(|p| bound_names(p, out)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| bound_names(p, out)),
        Pat::Struct(s) => s.fields.iter().for_each(|f| bound_names(&f.pat, out)),
        Pat::Slice(s) => s.elems.iter().for_each(|p| bound_names(p, out)),
        Pat::Reference(r) => bound_names(&r.pat, out),
        Pat::Paren(p) => bound_names(&p.pat, out),
        Pat::Type(t) => bound_names(&t.pat, out),
        _ => {}
    }
}
