//! The layer's `by` values, spelled as the attribute spells them, and the names it keeps for
//! the process's life (scopes, header names).

use std::sync::{Mutex, PoisonError};

use crate::limit::By;

/// Whether `b` may be in a header name (an RFC 9110 token).
pub(super) fn is_header_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A `by` value, as the attribute spells it.
pub(super) fn parse_by(text: &str) -> Option<By> {
    Some(match text {
        "global" => By::Global,
        "ip" => By::Ip,
        "url" => By::Url,
        "user" => By::User,
        "app_id" => By::AppId,
        other => {
            let name = other.strip_prefix("header:")?.trim();
            if name.is_empty() || !name.bytes().all(is_header_name_byte) {
                return None;
            }
            By::Header(intern(&name.to_ascii_lowercase()))
        }
    })
}

/// `s` for as long as the process lives, once per distinct value: the limits' scopes and
/// header names are `&'static str` (the attribute's are literals). Only validated names of
/// configured layers come here, so the memory this keeps is bounded by the configuration.
pub(super) fn intern(s: &str) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(name) = names.iter().find(|n| **n == s) {
        return name;
    }
    let name: &'static str = Box::leak(s.into());
    names.push(name);
    name
}
