//! Ferry's end-to-end tests, one module per area, in one test binary.
//!
//! One binary, not one per file: each integration-test binary compiles and
//! links its own copy of the Kubernetes, AWS and Ferry code it uses, which
//! on two cores cost minutes per file, and the test harness runs binaries
//! one after another, so a file with a single long test left a core idle.
//! Select an area by its module: `cargo test --workspace --test e2e
//! real_nodes::`.

mod adversarial;
mod api;
mod budgets;
mod chart;
mod harness;
mod images;
mod operator;
mod real_nodes;
mod reliability;
mod security;
mod tenancy;
mod web_identity;

/// Whether the long versions of the scenarios run (`FERRY_LONG=1`,
/// `hack/test.sh --long`); each has a smaller default.
fn long() -> bool {
    std::env::var("FERRY_LONG").is_ok_and(|v| v == "1")
}
