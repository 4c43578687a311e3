//! The stager binary's integration tests, in one test binary (one link of
//! the whole stack, not one per file): the conformance suite every backend
//! passes, and what production stores ask beyond it (TLS, temporary and
//! keyless credentials). Select one by its module: `cargo test --workspace
//! --test stager conformance::`.

mod common;
mod conformance;
mod hub;
mod tls;
