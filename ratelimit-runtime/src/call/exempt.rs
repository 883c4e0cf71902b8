//! The pipeline's first step over a request: the deny list and the exemptions
//! ([`crate::exempt::Exemptions`]), the same on every transport that has a caller.

use crate::caller::{Caller, Transport, ip};
use crate::exempt::CallerView;
use crate::limit::Limit;
use crate::limiter::Settings;
use crate::observe::{self, Outcome as Count};

use super::Refused;

/// What the deny list or an exemption makes of a request.
enum Exemption {
    Denied,
    Exempt,
}

/// The answer of the deny list (`Err`: denied) or of an exemption (`Ok(true)`: the call runs
/// unlimited) to this request, counted in the metrics; `Ok(false)` when it is limited as usual.
/// Plain functions have no caller to exempt: always limited.
///
/// The address is the one `by = "ip"` computes. A client unknown behind a trusted proxy
/// ([`ip::ClientAddr::Unknown`]) is denied when any address its forwarding header names is
/// denied, is never in an exempt network, and the predicate sees no address for it
/// ([`CallerView::ip`] is `None`): the proxy's address is never taken for the client's.
pub(super) fn exempted(
    caller: &Caller<'_>,
    settings: &Settings,
    limits: &[Limit],
) -> Result<bool, Refused> {
    if settings.exemptions.is_empty() || caller.transport == Transport::Plain {
        return Ok(false);
    }
    // A deny list cannot be applied without the client's address: refused with the reason
    // (as `by = "ip"` is), never served as if the list were empty.
    if caller.peer.is_none() && !settings.exemptions.deny_networks().is_empty() {
        return Err(Refused::Missing(crate::caller::Missing::Peer(
            caller.transport,
        )));
    }
    match exemption(caller, settings, limits) {
        None => Ok(false),
        Some(Exemption::Denied) => {
            observe::count_all(labels(limits), Count::Denied);
            Err(Refused::Denied)
        }
        Some(Exemption::Exempt) => {
            observe::count_all(labels(limits), Count::Exempted);
            Ok(true)
        }
    }
}

fn exemption(caller: &Caller<'_>, settings: &Settings, limits: &[Limit]) -> Option<Exemption> {
    let exemptions = &settings.exemptions;
    let resolved = caller
        .peer
        .map(|peer| ip::resolve(peer, caller.headers, &settings.http));
    let ip = resolved.as_ref().and_then(|r| r.client.known());
    if let Some(resolved) = &resolved {
        match resolved.client {
            ip::ClientAddr::Known(ip) => {
                if exemptions.is_denied_ip(ip) {
                    return Some(Exemption::Denied);
                }
                if exemptions.is_exempt_ip(ip) {
                    return Some(Exemption::Exempt);
                }
            }
            ip::ClientAddr::Unknown { .. } => {
                if resolved.named.iter().any(|&ip| exemptions.is_denied_ip(ip)) {
                    return Some(Exemption::Denied);
                }
            }
        }
    }
    let predicate = exemptions.predicate.as_ref()?;
    let header = |name: &str| caller.headers.first(name);
    let view = CallerView {
        ip,
        user: caller.user,
        path: caller.path_or_empty(),
        header: &header,
        scope: limits.first().map_or("", |l| l.scope),
    };
    predicate(&view).then_some(Exemption::Exempt)
}

/// The metric labels of `limits`.
pub(super) fn labels(
    limits: &[Limit],
) -> impl Iterator<Item = (&'static str, crate::algorithm::Algorithm)> + '_ {
    limits.iter().map(|l| (l.scope, l.policy.algorithm()))
}
