//! Which requests a layer limit applies to: its paths (`.path(…)`, `.except_path(…)`) and
//! methods (`.method(…)`), matched against every spelling of the request's path
//! ([`RouteForms`]) so that no spelling of a limited route escapes its limit.

use http::Method;

use crate::caller::path::{RouteForms, route_path};

/// A validated path pattern: `/login` (that path) or `/api/*` (`/api` and every path below it;
/// `/*` is every path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pattern {
    /// The path, or the prefix's path without its `/*` (empty for `/*`).
    base: String,
    prefix: bool,
}

impl Pattern {
    /// `pattern`, or why it is not one.
    pub(super) fn parse(pattern: &str) -> Result<Self, &'static str> {
        if !pattern.starts_with('/') {
            return Err("a path starts with `/`");
        }
        let (base, prefix) = match pattern.strip_suffix("/*") {
            Some(base) => (base, true),
            None => (pattern, false),
        };
        if base.contains('*') {
            return Err("`*` may only end a pattern, as the segment `/*` (`/api/*`)");
        }
        if base.contains(['?', '#']) {
            return Err("a pattern is a path: no query (`?`) or fragment (`#`)");
        }
        if base.contains(['%', ';', '\\'])
            || base.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(
                "write the path decoded, without `%`, `;`, `\\`, spaces or control characters",
            );
        }
        if !base.is_empty() && route_path(base) != base.to_ascii_lowercase() {
            return Err("no empty, `.` or `..` segment and no trailing `/` (`/login`, `/api/*`)");
        }
        Ok(Self {
            base: base.to_owned(),
            prefix,
        })
    }

    /// Whether `form` is this path (or below this prefix), ASCII case folded or not.
    fn matches(&self, form: &str, fold: bool) -> bool {
        let (base, form) = (self.base.as_bytes(), form.as_bytes());
        let eq = |a: &[u8], b: &[u8]| {
            if fold {
                a.eq_ignore_ascii_case(b)
            } else {
                a == b
            }
        };
        if !self.prefix {
            return eq(form, base);
        }
        match form.split_at_checked(base.len()) {
            Some((head, rest)) => eq(head, base) && matches!(rest.first(), None | Some(b'/')),
            None => false,
        }
    }

    /// `.path(…)`: any form matches, in any case.
    fn includes(&self, forms: &RouteForms<'_>) -> bool {
        forms.all().iter().any(|form| self.matches(form, true))
    }

    /// `.except_path(…)`: every form matches — the path as sent and as `by = "url"` decodes
    /// it in its own case, the reduced one folded (it is lower-case).
    fn excludes(&self, forms: &RouteForms<'_>) -> bool {
        self.matches(forms.raw, false)
            && self.matches(&forms.decoded, false)
            && self.matches(&forms.canonical, true)
    }
}

/// The requests one limit applies to: every request when nothing is set.
#[derive(Debug, Clone, Default)]
pub(super) struct Route {
    pub(super) paths: Vec<Pattern>,
    pub(super) except: Vec<Pattern>,
    pub(super) methods: Vec<Method>,
}

impl Route {
    /// Whether the limit applies to every request.
    pub(super) fn is_any(&self) -> bool {
        self.paths.is_empty() && self.except.is_empty() && self.methods.is_empty()
    }

    /// Whether the limit reads the path.
    pub(super) fn reads_path(&self) -> bool {
        !self.paths.is_empty() || !self.except.is_empty()
    }

    /// Whether the limit applies to a request of `method` whose path has `forms` (`None`
    /// only when no limit of the layer reads the path).
    pub(super) fn applies(&self, method: &Method, forms: Option<&RouteForms<'_>>) -> bool {
        if !self.methods.is_empty() && !self.methods.iter().any(|m| method_matches(m, method)) {
            return false;
        }
        let Some(forms) = forms else {
            return true;
        };
        (self.paths.is_empty() || self.paths.iter().any(|p| p.includes(forms)))
            && !self.except.iter().any(|p| p.excludes(forms))
    }
}

/// Whether a request of `method` is one of `limit`'s: the same method in any case (an
/// extension method `get` is limited as `GET`), and `HEAD` for `GET` (Axum, like most
/// routers, answers `HEAD` with the `GET` handler).
fn method_matches(limit: &Method, method: &Method) -> bool {
    limit.as_str().eq_ignore_ascii_case(method.as_str())
        || (*limit == Method::GET && method.as_str().eq_ignore_ascii_case("HEAD"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn route(paths: &[&str], except: &[&str]) -> Route {
        Route {
            paths: paths.iter().map(|p| Pattern::parse(p).unwrap()).collect(),
            except: except.iter().map(|p| Pattern::parse(p).unwrap()).collect(),
            methods: Vec::new(),
        }
    }

    fn applies(route: &Route, path: &str) -> bool {
        route.applies(&Method::GET, Some(&RouteForms::of(path)))
    }

    /// Hostile spellings of `/login` are all limited by the login limit; the plain path is
    /// left out of the catch-all, its odd spellings may be limited by both.
    #[test]
    fn every_spelling_of_login_is_limited_by_the_login_limit() {
        let login = route(&["/login"], &[]);
        let rest = route(&[], &["/login"]);
        assert!(applies(&login, "/login"));
        assert!(!applies(&rest, "/login"));
        for spelling in [
            "/LOGIN",
            "/Login",
            "//login",
            "/login/",
            "/log%69n",
            "/log%2569n",
            "/login;x",
            "/login;jsessionid=abc",
            "/x/../login",
            "/x/..;/login",
            "/%2E/login",
            "/x%2F..%2Flogin",
            "\\login",
            "/login%2F",
        ] {
            assert!(applies(&login, spelling), "{spelling}");
        }
        // Another route is not login's.
        for other in [
            "/login2",
            "/logins",
            "/log",
            "/login.json",
            "/api/login",
            "/login/x",
        ] {
            assert!(!applies(&login, other), "{other}");
            assert!(applies(&rest, other), "{other}");
        }
    }

    #[test]
    fn prefixes_cover_their_path_and_below_and_exceptions_are_never_wider() {
        let api = route(&["/api/*"], &[]);
        for yes in [
            "/api",
            "/api/",
            "/api/x",
            "/API/x/y",
            "//api//x",
            "/x/../api/y",
            "/api/../admin",
        ] {
            assert!(applies(&api, yes), "{yes}");
        }
        for no in ["/apix", "/ap", "/", "/admin"] {
            assert!(!applies(&api, no), "{no}");
        }
        let all = route(&["/*"], &[]);
        assert!(applies(&all, "/") && applies(&all, "/anything/at/all") && applies(&all, "*"));
        // Out of a limit only when every spelling is the excepted path.
        let public_out = route(&[], &["/public/*"]);
        assert!(!applies(&public_out, "/public/a"));
        assert!(!applies(&public_out, "/public"));
        for limited in [
            "/public/../admin",
            "/public%2F..%2Fadmin",
            "/PUBLIC/a",
            "/publicx",
            "/%70ublic/a",
        ] {
            assert!(applies(&public_out, limited), "{limited}");
        }
    }

    #[test]
    fn methods_match_in_any_case_and_get_covers_head() {
        let post = Route {
            methods: vec![Method::POST],
            ..Route::default()
        };
        assert!(post.applies(&Method::POST, None));
        assert!(post.applies(&Method::from_bytes(b"post").unwrap(), None));
        assert!(!post.applies(&Method::GET, None));
        let get = Route {
            methods: vec![Method::GET],
            ..Route::default()
        };
        assert!(get.applies(&Method::HEAD, None));
        assert!(!get.applies(&Method::PUT, None));
        assert!(Route::default().is_any());
    }

    #[test]
    fn patterns_are_validated() {
        for good in [
            "/",
            "/login",
            "/api/*",
            "/*",
            "/a/b-c_d.e~f",
            "/caf\u{e9}",
            "/Login",
        ] {
            assert!(Pattern::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "", "login", "/login/", "//login", "/a//b", "/./a", "/a/..", "/a*", "/a/*/b", "/*/*",
            "/login?x", "/login#x", "/log%69n", "/login;x", "/a\\b", "/a b", "/a\tb",
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        /// With `.path(p)` on one limit and `.except_path(p)` on the catch-all, any
        /// request path (any bytes a URI path may hold, escapes, dots, slashes, case) is
        /// limited by at least one of the two: never by neither.
        #[test]
        fn any_path_is_matched_or_limited_by_the_catch_all(
            path in "[/a-zA-Z0-9.;%\\\\~_-]{0,32}",
            pattern in prop::sample::select(vec!["/login", "/api/*", "/a/b", "/", "/*", "/Login"]),
        ) {
            let limited = route(&[pattern], &[]);
            let rest = route(&[], &[pattern]);
            let forms = RouteForms::of(&path);
            prop_assert!(
                limited.applies(&Method::GET, Some(&forms)) || rest.applies(&Method::GET, Some(&forms)),
                "{path:?} escapes both limits of {pattern}"
            );
        }
    }
}
