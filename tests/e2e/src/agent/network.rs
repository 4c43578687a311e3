//! A pod's network identity on a machine without network namespaces.
//!
//! Every pod gets its own loopback address (Linux routes all of 127/8 to
//! `lo`, so any of them can be bound without set-up), reported as its
//! `podIP`, which is what Services, EndpointSlices and Prometheus's
//! Kubernetes discovery use to reach it. A container that listens on the
//! wildcard address would, in a real pod, listen only inside its own
//! network namespace; here two such pods would collide on one port, so a
//! wildcard listen address in `args`, `command` or env values
//! (`0.0.0.0:PORT`, `[::]:PORT`) is rewritten to the pod's address.
//! Programs that bind the wildcard by default, without saying so on their
//! command line, are not rewritten: give them the address explicitly.

use std::net::Ipv4Addr;

/// The loopback address of the pod with `uid`: stable for the pod's life
/// (the agent may restart its containers) and spread over 127.100.0.0/10
/// so that two pods colliding is a one-in-millions event.
pub fn pod_ip(uid: &str) -> Ipv4Addr {
    // FNV-1a: stable across runs and platforms, unlike std's hasher.
    let hash = uid.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let second = 100 + (hash % 100) as u8;
    let third = (hash >> 8) as u8;
    let fourth = 1 + ((hash >> 16) % 254) as u8;
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
        assert!(a.is_loopback() && a != Ipv4Addr::LOCALHOST);
        let distinct: std::collections::BTreeSet<_> = (0..500).map(|i| pod_ip(&format!("uid-{i}"))).collect();
        assert_eq!(distinct.len(), 500);
    }

    #[test]
    fn wildcard_listen_addresses_become_the_pods_own() {
        let ip = Ipv4Addr::new(127, 100, 1, 2);
        assert_eq!(bind_to_pod("--metrics-addr=0.0.0.0:9464", ip), "--metrics-addr=127.100.1.2:9464");
        assert_eq!(bind_to_pod("[::]:8080", ip), "127.100.1.2:8080");
        assert_eq!(bind_to_pod("http://127.0.0.1:9000", ip), "http://127.0.0.1:9000");
    }
}
