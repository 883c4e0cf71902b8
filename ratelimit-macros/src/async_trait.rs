//! Methods that `#[async_trait]` rewrote before `#[rate_limit]` saw them.
//!
//! `#[async_trait]` on an impl (or on a trait's default methods) expands first and turns each
//! `async fn m(&self, a: A) -> R { body }` into
//!
//! ```text
//! fn m<'life0, 'async_trait>(&'life0 self, a: A)
//!     -> Pin<Box<dyn Future<Output = R> + Send + 'async_trait>>
//! {
//!     Box::pin(async move {
//!         if let Some(__ret) = None::<R> { return __ret; }
//!         let __self = self;          // the receiver, which the body now calls `__self`
//!         let a = a;                  // one `let` per by-value argument (patterns kept)
//!         let __ret: R = { body };
//!         __ret
//!     })
//! }
//! ```
//!
//! That shape is recognised here (a non-async fn returning `Pin<Box<dyn Future<Output = R>>>`
//! whose only statement is `Box::pin(async move { … })`), and the check goes at the top of the
//! user's body inside the future: it runs when the future is polled, after the arguments are
//! bound, and a rejected call returns `Err(E::from(error))` as `R` without running the body.

use proc_macro2::Ident;
use syn::{
    Block, Expr, GenericArgument, ItemFn, Pat, PathArguments, ReturnType, Stmt, Type,
    TypeParamBound,
};

/// What the rewritten method tells about the original `async fn`.
#[derive(Debug)]
pub(crate) struct AsyncTrait {
    /// `R`, the original return type: the `Output` of the boxed future (`None` for `()`,
    /// which async-trait writes for a method that returns nothing).
    pub(crate) output: Option<Type>,
    /// The names the argument `let`s bind inside the future (patterns included), which a key
    /// template may read.
    pub(crate) bound: Vec<String>,
    /// `__self`, when the receiver was renamed: a template's `{self…}` reads it.
    pub(crate) self_alias: Option<Ident>,
}

/// `Some` when `func` has the shape `#[async_trait]` gives a method.
pub(crate) fn recognise(func: &ItemFn) -> Option<AsyncTrait> {
    if func.sig.asyncness.is_some() {
        return None;
    }
    let output = match future_output(&func.sig.output)? {
        Type::Tuple(unit) if unit.elems.is_empty() => None,
        ty => Some(ty.clone()),
    };
    let inner = boxed_async_block(&func.block)?;
    let mut bound = Vec::new();
    let mut self_alias = None;
    if user_body_index(inner).is_some() {
        for stmt in &inner.stmts {
            let Stmt::Local(local) = stmt else { continue };
            match &local.pat {
                Pat::Ident(p) if p.ident == "__self" => self_alias = Some(p.ident.clone()),
                Pat::Type(t) if matches!(&*t.pat, Pat::Ident(p) if p.ident == "__ret") => break,
                pat => crate::pat::bound_names(pat, &mut bound),
            }
        }
    }
    Some(AsyncTrait {
        output,
        bound,
        self_alias,
    })
}

/// Whether `name` is one of the `__argN` that async-trait gives a pattern parameter in the
/// signature (the pattern itself is bound inside the future).
pub(crate) fn is_positional(name: &str) -> bool {
    name.strip_prefix("__arg")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The block the check goes in front of: the user's body (`let __ret: R = { … };`) when it is
/// there, else the whole `async move` block (before any argument is moved).
pub(crate) fn check_site(func: &mut ItemFn) -> Option<&mut Block> {
    let Some(Stmt::Expr(Expr::Call(call), None)) = func.block.stmts.first_mut() else {
        return None;
    };
    let Some(Expr::Async(inner)) = call.args.first_mut() else {
        return None;
    };
    let inner = &mut inner.block;
    match user_body_index(inner) {
        Some(i) => match &mut inner.stmts[i] {
            Stmt::Local(local) => match local.init.as_mut().map(|init| &mut *init.expr) {
                Some(Expr::Block(body)) => Some(&mut body.block),
                _ => None,
            },
            _ => None,
        },
        None => Some(inner),
    }
}

/// The index of `let __ret: R = { … };` in the future's block.
fn user_body_index(inner: &Block) -> Option<usize> {
    inner.stmts.iter().position(|stmt| {
        let Stmt::Local(local) = stmt else {
            return false;
        };
        let Pat::Type(t) = &local.pat else {
            return false;
        };
        matches!(&*t.pat, Pat::Ident(p) if p.ident == "__ret")
            && local
                .init
                .as_ref()
                .is_some_and(|init| init.diverge.is_none() && matches!(&*init.expr, Expr::Block(_)))
    })
}

/// The block of `Box::pin(async move { … })` when that is the function's only statement.
fn boxed_async_block(block: &Block) -> Option<&Block> {
    let [Stmt::Expr(Expr::Call(call), None)] = block.stmts.as_slice() else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    let names: Vec<String> = func
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    if !names.ends_with(&["Box".to_owned(), "pin".to_owned()]) || call.args.len() != 1 {
        return None;
    }
    match call.args.first() {
        Some(Expr::Async(inner)) => Some(&inner.block),
        _ => None,
    }
}

/// `R` in `Pin<Box<dyn Future<Output = R> + …>>` (any path prefix on the three names).
fn future_output(output: &ReturnType) -> Option<&Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let boxed = only_type_argument(ty, "Pin")?;
    let Type::TraitObject(object) = only_type_argument(boxed, "Box")? else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let last = bound.path.segments.last()?;
        if last.ident != "Future" {
            return None;
        }
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
            _ => None,
        })
    })
}

/// `T` in `name<T>` (the last path segment named `name`, with exactly one argument).
fn only_type_argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let last = path.path.segments.last()?;
    if last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.iter().collect::<Vec<_>>().as_slice() {
        [GenericArgument::Type(t)] => Some(t),
        _ => None,
    }
}
