//! How Ferry's operator and stager write their metrics for a scraper.
//!
//! `prometheus-client` writes OpenMetrics only. Prometheus negotiates
//! OpenMetrics, but much of the ecosystem (`promtool check metrics`, older
//! scrapers, `curl | grep`) reads the classic Prometheus text format 0.0.4.
//! So, as Prometheus's own client libraries do, `/metrics` answers in
//! OpenMetrics when the request's `Accept` asks for it and in the text
//! format otherwise. This crate only renders and negotiates; serving is the
//! binaries' business, and metric names live with each binary.

use prometheus_client::registry::Registry;

/// `Content-Type` of OpenMetrics 1.0.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The exposition of `registry` for a request that sent `accept`: the
/// content type to answer with and the body.
pub fn render(registry: &Registry, accept: Option<&str>) -> (&'static str, String) {
    let mut openmetrics = String::new();
    prometheus_client::encoding::text::encode(&mut openmetrics, registry).expect("writing to a String cannot fail");
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (OPENMETRICS, openmetrics)
    } else {
        (PROMETHEUS_TEXT, to_prometheus_text(&openmetrics))
    }
}

/// Rewrites OpenMetrics as written by `prometheus-client` into the
/// Prometheus text format 0.0.4: counter families take their samples'
/// `_total` name in `# HELP` and `# TYPE`, `unknown` becomes `untyped`, and
/// the `# UNIT` and `# EOF` lines, which that format lacks, are dropped.
/// Sample lines are the same in both formats.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> =
        openmetrics.lines().filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = if counters.contains(name) { format!("{name}_total") } else { name.to_owned() };
            let tail = if *prefix == "# TYPE " && tail == "unknown" { "untyped" } else { tail };
            Some(format!("{prefix}{name} {tail}"))
        });
        out.push_str(rewritten.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Unit;

    fn registry() -> Registry {
        let mut registry = Registry::with_prefix("ferry_test");
        let counter = Counter::<u64>::default();
        counter.inc_by(42);
        registry.register_with_unit("transferred", "Bytes moved", Unit::Bytes, counter);
        let histogram = Histogram::new([0.5, 1.0]);
        histogram.observe(0.7);
        registry.register_with_unit("request_duration", "Request time", Unit::Seconds, histogram);
        registry
    }

    #[test]
    fn openmetrics_is_served_only_to_scrapers_that_ask_for_it() {
        let (kind, body) = render(&registry(), Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"));
        assert_eq!(kind, OPENMETRICS);
        assert!(body.ends_with("# EOF\n") && body.contains("# TYPE ferry_test_transferred_bytes counter"), "{body}");
        let (kind, _) = render(&registry(), Some("*/*"));
        assert_eq!(kind, PROMETHEUS_TEXT);
        assert_eq!(render(&registry(), None).0, PROMETHEUS_TEXT);
    }

    #[test]
    fn the_text_format_names_counter_families_by_their_samples_and_drops_units() {
        let (_, text) = render(&registry(), None);
        assert!(text.contains("# HELP ferry_test_transferred_bytes_total Bytes moved"), "{text}");
        assert!(
            text.contains("# TYPE ferry_test_transferred_bytes_total counter\nferry_test_transferred_bytes_total 42\n")
        );
        assert!(text.contains("# TYPE ferry_test_request_duration_seconds histogram"));
        assert!(text.contains("ferry_test_request_duration_seconds_bucket{le=\"1.0\"} 1"));
        assert!(!text.contains("# UNIT") && !text.contains("# EOF"), "{text}");
    }
}
