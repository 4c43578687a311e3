//! The object-storage trait and integrity types the engine copies through:
//! the `ferry-store` crate, re-exported (the engine compiles none of its
//! backends; the front ends choose them), and two stores for the engine's
//! own tests: one in memory with injectable faults, one of synthetic data
//! of any size.

pub use ferry_store::*;

#[cfg(test)]
pub mod memory;
#[cfg(test)]
pub mod synthetic;
