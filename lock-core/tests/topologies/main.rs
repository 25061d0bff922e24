//! Topologies: Sentinel, Cluster (kinds, slot migration), RedLock, TLS, and the Sentinel soak.
//!
//! One test binary of several modules (each links the whole dependency tree once).

#[path = "../common/mod.rs"]
mod common;

mod cluster_migration;
mod kinds_cluster;
mod redlock;
mod review_e;
mod review_g;
mod review_h;
mod review_n;
mod review_o;
mod review_r;
mod review_s;
mod review_u;
mod review_x;
mod review_y;
mod review_z;
mod sentinel_auth;
mod soak_sentinel;
mod tls;
mod tls_provider;
mod topologies;
