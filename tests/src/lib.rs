//! Test support: private Redis servers and clusters.
