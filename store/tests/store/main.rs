//! The store crate's backends against real servers, in one test binary:
//! Azure Blob against Azurite, OCI against distribution's registry.
//! Select one by its module: `cargo test --workspace --test store azure::`.

mod azure;
mod oci;
