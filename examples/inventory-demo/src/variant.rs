//! The purchase variants the demo runs, and the route of each: four the service has, two it
//! gets from the demo ([`control`](crate::control)).

/// How a purchase endpoint protects its read-check-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Variant {
    /// No lock: the bug. Concurrent purchases read the same stock and all sell. The demo's.
    Unlocked,
    /// `#[distributed_lock(key = "inventory:<sku>", wait = "10s", locker = self.locker,
    /// fence = fence)]` on the service method; the write carries the fencing token.
    Macro,
    /// The route behind `DistributedLockLayer` with `KeyFrom::path_param_as::<i64>("sku")`,
    /// waiting for the lock; the write carries the lock's fencing token, as `Fenced`'s does.
    Layer,
    /// The same layer with its default wait of zero: a purchase that finds the SKU locked is
    /// answered `409 busy` with `Retry-After` at once, and the client retries.
    LayerFailFast,
    /// `Locker::lock` with a fixed lease, plus the fencing token checked by the database.
    Fenced,
    /// `Locker::lock` with a fixed lease and an `is_held()` check before the write, but no
    /// fencing token: correct until a holder stalls past its lease (`--chaos`). The demo's.
    LockedNoFence,
}

impl Variant {
    /// The variants the demo runs by default.
    pub const DEFAULT: [Self; 5] = [
        Self::Unlocked,
        Self::Macro,
        Self::Layer,
        Self::LayerFailFast,
        Self::Fenced,
    ];

    /// The name used in URLs, orders and the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unlocked => "unlocked",
            Self::Macro => "macro",
            Self::Layer => "layer",
            Self::LayerFailFast => "layer-fail-fast",
            Self::Fenced => "fenced",
            Self::LockedNoFence => "locked-no-fence",
        }
    }

    /// The axum route of the purchase endpoint.
    pub fn route(self) -> &'static str {
        match self {
            Self::Unlocked => "/skus/{sku}/purchase/unlocked",
            Self::Macro => "/skus/{sku}/purchase/macro",
            Self::Layer => "/skus/{sku}/purchase/layer",
            Self::LayerFailFast => "/skus/{sku}/purchase/layer-fail-fast",
            Self::Fenced => "/skus/{sku}/purchase/fenced",
            Self::LockedNoFence => "/skus/{sku}/purchase/locked-no-fence",
        }
    }

    /// The path of a purchase of `sku`.
    pub fn path(self, sku: i64) -> String {
        format!("/skus/{sku}/purchase/{}", self.name())
    }

    /// Whether the variant takes a distributed lock (and so must never oversell without
    /// chaos).
    pub fn is_locked(self) -> bool {
        !matches!(self, Self::Unlocked)
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_routes() {
        for &variant in <Variant as clap::ValueEnum>::value_variants() {
            assert_eq!(variant.route().replace("{sku}", "42"), variant.path(42));
            let parsed = <Variant as clap::ValueEnum>::from_str(variant.name(), false);
            assert_eq!(parsed, Ok(variant));
        }
    }
}
