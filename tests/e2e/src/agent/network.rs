//! A pod's network identity without a network namespace per pod.
//!
//! Every pod gets its own address, reported as its `podIP`, which is what
//! Services, EndpointSlices and Prometheus's Kubernetes discovery use to
//! reach it. Where the [`POD_NETWORK`] is routed to `lo` (what
//! `hack/netns.sh` sets up, in a network namespace of the test run's own),
//! the address comes from it, and the API server accepts it as an endpoint:
//! it can then call a webhook behind a Service, as in a cluster. Elsewhere
//! it is a loopback address (Linux routes all of 127/8 to `lo`), which
//! works for everything but endpoints. A container that listens on the
//! wildcard address would, in a real pod, listen only inside its own
//! network namespace; here two such pods would collide on one port, so a
//! wildcard listen address in `args`, `command` or env values
//! (`0.0.0.0:PORT`, `[::]:PORT`) is rewritten to the pod's address.
//! Programs that bind the wildcard by default, without saying so on their
//! command line, are not rewritten: give them the address explicitly.

use std::net::Ipv4Addr;
use std::sync::OnceLock;

/// The pod network, when routed locally: 10.224.0.0/12 (`hack/netns.sh`).
pub const POD_NETWORK: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 224, 0, 0), 12);

/// Whether addresses of the [`POD_NETWORK`] can be bound here (probed once).
pub fn pod_network_routed() -> bool {
    static ROUTED: OnceLock<bool> = OnceLock::new();
    *ROUTED.get_or_init(|| std::net::TcpListener::bind((Ipv4Addr::new(10, 239, 255, 254), 0)).is_ok())
}

/// The address of the pod with `uid`: stable for the pod's life (the agent
/// may restart its containers) and spread so that two pods colliding is a
/// one-in-millions event.
pub fn pod_ip(uid: &str) -> Ipv4Addr {
    // FNV-1a: stable across runs and platforms, unlike std's hasher.
    let hash = uid.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let third = (hash >> 8) as u8;
    let fourth = 1 + ((hash >> 16) % 253) as u8;
    if pod_network_routed() {
        let [first, second, ..] = POD_NETWORK.0.octets();
        return Ipv4Addr::new(first, second + (hash % 16) as u8, third, fourth);
    }
    let second = 100 + (hash % 100) as u8;
    Ipv4Addr::new(127, second, third, fourth)
}

/// `value` with every wildcard listen address replaced by `ip`.
pub fn bind_to_pod(value: &str, ip: Ipv4Addr) -> String {
    value.replace("0.0.0.0:", &format!("{ip}:")).replace("[::]:", &format!("{ip}:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_addresses_are_stable_loopback_and_distinct() {
        let a = pod_ip("1b4e28ba-2fa1-11d2-883f-0016d3cca427");
        assert_eq!(a, pod_ip("1b4e28ba-2fa1-11d2-883f-0016d3cca427"));
        assert!(a != Ipv4Addr::LOCALHOST && (a.is_loopback() || (a.octets()[0] == 10 && a.octets()[1] & 0xf0 == 224)));
        let distinct: std::collections::BTreeSet<_> = (0..100).map(|i| pod_ip(&format!("uid-{i}"))).collect();
        assert_eq!(distinct.len(), 100);
    }

    #[test]
    fn wildcard_listen_addresses_become_the_pods_own() {
        let ip = Ipv4Addr::new(127, 100, 1, 2);
        assert_eq!(bind_to_pod("--metrics-addr=0.0.0.0:9464", ip), "--metrics-addr=127.100.1.2:9464");
        assert_eq!(bind_to_pod("[::]:8080", ip), "127.100.1.2:8080");
        assert_eq!(bind_to_pod("http://127.0.0.1:9000", ip), "http://127.0.0.1:9000");
    }
}
