//! Test support: private Redis servers and clusters.

pub mod suite;
